"""The detour closed loop in real time against a running `oxygen-serve` (`oxygen-eval-table --policy=remote`):
real threads, a real clock and a websocket, on the shipped pi05_detour model served in a subprocess."""

import json

import pytest
from conftest import OPENPI_CLIENT_WARNING, run_script, serve_script

from oxygen_jax.client import protocol
from oxygen_jax.evaluation import closed_loop, served_loop

pytestmark = [pytest.mark.timeout(600), OPENPI_CLIENT_WARNING]
pytest.importorskip("openpi_client.websocket_client_policy")


def test_requests_that_continue_no_chunk_ask_for_the_fresh_samples():
    """As the simulated loop draws `fresh_samples` for a request without `rtc` and one chunk for one with it,
    the served loop asks the server for them (`samples`)."""
    sent = []
    infer = served_loop.with_samples(lambda obs: sent.append(obs) or {}, 8)
    infer({"state": 1})
    infer({"state": 2, protocol.RTC: {"executed": 1}})
    assert sent == [{"state": 1, "samples": 8}, {"state": 2, protocol.RTC: {"executed": 1}}]
    one = served_loop.with_samples(lambda obs: sent.append(obs) or {}, 1)
    one({"state": 3})
    assert sent[-1] == {"state": 3}


@pytest.mark.integration
def test_served_episodes_end_and_report_the_simulated_fields_and_the_latencies(tmp_path):
    with serve_script(
        tmp_path, model=("--config=pi05_detour", "--params_dtype=float32", "--max_samples=4"), golden=False
    ) as (
        _,
        port,
    ):
        served = run_script(
            "eval_table",
            "--policy=remote",
            f"--port={port}",
            "--config=pi05_detour",
            "--execution=rtc",
            "--episodes=3",
            "--control_hz=10",
            "--fresh_samples=4",  # each episode's first request draws 4 chunks on the server
            f"--out={tmp_path / 'served'}",
        )
    assert served.returncode == 0, served.stderr[-3000:]
    simulated = run_script(
        "eval_table", "--execution=rtc", "--delay_steps=1", "--episodes=1", f"--out={tmp_path / 'simulated'}"
    )
    assert simulated.returncode == 0, simulated.stderr[-3000:]
    served_results = json.loads((tmp_path / "served" / "results.json").read_text())
    simulated_results = json.loads((tmp_path / "simulated" / "results.json").read_text())

    assert set(simulated_results) <= set(served_results)
    assert served_results["episodes"] == 3 and served_results["control_hz"] == 10
    assert served_results["fresh_samples"] == 4
    # Every episode ended (reached the cube, hit the block or ran out of steps), and the model, whose
    # recorded success is 0.94 without latency, reached the cube in some.
    assert served_results["success_rate"] > 0
    assert served_results["success_rate"] + served_results["collision_rate"] <= 1
    assert served_results["mean_steps"] <= closed_loop.MAX_STEPS
    # Each episode asks for at least two chunks; their first replies are left out of the latencies.
    assert served_results["latency_replies"] >= 3
    histogram = served_results["latency_steps_histogram"]
    assert sum(histogram.values()) == served_results["latency_replies"]
    assert served_results["delay_steps"] >= 1  # a real reply takes at least part of a tick
    assert served_results["latency_steps_p10"] <= served_results["latency_steps_p50"]
    assert served_results["latency_steps_p50"] <= served_results["latency_steps_max"]
    # Each episode's first request (no chunk to continue: 4 samples) is measured apart, one per episode.
    assert served_results["fresh_latency_replies"] == 3
    assert 0 < served_results["fresh_latency_steps_p50"] <= served_results["fresh_latency_steps_max"]
    # The same replies counted in control ticks, what `--latency_jitter=served` replays.
    assert sum(served_results["fresh_latency_ticks_histogram"].values()) == 3
    assert sum(served_results["latency_ticks_histogram"].values()) == served_results["latency_replies"]


@pytest.mark.integration
def test_served_loop_refuses_a_fixed_delay(tmp_path):
    result = run_script(
        "eval_table", "--policy=remote", "--port=1", "--delay_steps=2", f"--out={tmp_path}", timeout_s=120
    )
    assert result.returncode != 0
    assert "--policy=remote measures d" in result.stderr
