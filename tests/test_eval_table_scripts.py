"""scripts/eval_table.py and scripts/sweep_eval_table.py end to end on the shipped detour model: the
results.json fields, a one-line error for bad flags, and the sweep's files and plot."""

import json
import subprocess
import sys

import pytest
from conftest import CLOSED_LOOP_FIELDS, SCRIPTS

pytestmark = pytest.mark.integration  # runs scripts on the shipped model: the second tier


def _run(script: str, *args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, str(SCRIPTS / f"{script}.py"), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)


def test_eval_table_writes_results_json(tmp_path):
    run = _run(
        "eval_table",
        "--execution=rtc",
        "--latency_ms=250",
        "--episodes=3",
        "--seed=1",
        "--rtc_schedule=linear",
        "--max_guidance_weight=2",
        "--prefix_horizon=5",
        "--noise_dims=2",
        f"--out={tmp_path}",
    )
    assert run.returncode == 0, run.stderr[-2000:]
    results = json.loads((tmp_path / "results.json").read_text())
    assert set(results) >= CLOSED_LOOP_FIELDS
    assert results["noise_dims"] == 2
    assert (results["config"], results["rtc_method"]) == ("pi05_detour", "guided")
    assert (results["execution"], results["delay_steps"], results["episodes"]) == ("rtc", 3, 3)
    assert results["action_horizon"] == 10 and results["execution_horizon"] == 6
    assert (results["rtc_schedule"], results["max_guidance_weight"], results["prefix_horizon"]) == (
        "linear",
        2,
        5,
    )
    assert 0 <= results["success_rate"] <= 1 and results["jerk_mean"] > 0
    # Three episodes of ~25 steps switch chunks several times each, and the old chunk covers the switch.
    assert results["switches"] >= 6 and 0 <= results["switch_jump_mean"] <= results["switch_jump_max"]


def test_eval_table_runs_bid_under_jittered_latency_with_a_wrong_delay_estimate(tmp_path):
    run = _run(
        "eval_table",
        "--execution=bid",
        "--fresh_samples=4",
        "--delay_steps=3",
        "--latency_jitter=heavy_tail",
        "--delay_estimate=1",
        "--episodes=2",
        f"--out={tmp_path}",
    )
    assert run.returncode == 0, run.stderr[-2000:]
    results = json.loads((tmp_path / "results.json").read_text())
    assert set(results) >= CLOSED_LOOP_FIELDS
    assert (results["execution"], results["rtc_method"], results["fresh_samples"]) == ("bid", None, 4)
    assert (results["latency_jitter"], results["delay_estimate"], results["bid_weak_steps"]) == (
        "heavy_tail",
        1,
        2,
    )
    assert results["switches"] >= 2 and 0 <= results["success_rate"] <= 1


@pytest.mark.parametrize(
    ("script", "flags", "message"),
    [
        (
            "eval_table",
            ["--delay_steps=2", "--latency_ms=200"],
            "exactly one of --delay_steps and --latency_ms",
        ),
        ("eval_table", ["--delay_steps=10"], "delay_steps must lie in [0, 9]"),
        ("eval_table", ["--delay_steps=7", "--execution=naive"], "exceeds execution_horizon 6"),
        ("eval_table", ["--delay_steps=2", "--noise_dims=33"], "noise_dims must lie in [1, 32]"),
        ("eval_table", ["--delay_steps=2", "--delay_estimate=10"], "delay_estimate must lie in [0, 9]"),
        ("eval_table", ["--delay_steps=2", "--execution=bid"], "--execution=bid needs --fresh_samples >= 2"),
        ("eval_table", ["--policy=remote", "--max_steps=50"], "(no --max_steps)"),
        ("sweep_eval_table", ["--delays=0,7"], "exceeds execution_horizon 6"),
        ("sweep_eval_table", ["--noise_dims=33"], "noise_dims must lie in [1, 32]"),
    ],
)
def test_closed_loop_scripts_refuse_bad_flags_in_one_line_before_the_model_loads(
    tmp_path, script, flags, message
):
    run = _run(script, *flags, "--episodes=1", f"--out={tmp_path}")
    assert run.returncode == 2
    (line,) = run.stderr.strip().splitlines()
    assert line.startswith("error: ") and message in line
    assert not any(tmp_path.iterdir())  # nothing ran


def test_sweep_writes_every_run_and_the_plot(tmp_path):
    run = _run("sweep_eval_table", "--delays=0,2", "--episodes=1", f"--out={tmp_path}")
    assert run.returncode == 0, run.stderr[-2000:]
    rows = json.loads((tmp_path / "sweep.json").read_text())
    assert [(r["execution"], r["delay_steps"]) for r in rows] == [
        (mode, d) for mode in ("sync", "naive", "rtc") for d in (0, 2)
    ]
    for row in rows:
        saved = json.loads(
            (tmp_path / f"{row['execution']}_d{row['delay_steps']}" / "results.json").read_text()
        )
        assert saved == row
    png = (tmp_path / "closed_loop.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


def test_eval_table_runs_the_task_its_config_names(tmp_path):
    """`--config=pi05_detour_moving` alone runs the moving detour task, with its own episode budget."""
    run = _run(
        "eval_table",
        "--config=pi05_detour_moving",
        "--execution=rtc",
        "--delay_steps=2",
        "--episodes=2",
        f"--out={tmp_path}",
    )
    assert run.returncode == 0, run.stderr[-2000:]
    results = json.loads((tmp_path / "results.json").read_text())
    assert (results["config"], results["task"], results["max_steps"]) == (
        "pi05_detour_moving",
        "detour_moving",
        42,
    )
    assert results["rtc_method"] == "conditioned" and results["episodes"] == 2


def test_eval_table_runs_to_the_budget_it_is_given(tmp_path):
    """`--max_steps` replaces the task's budget; the histograms hold every episode that succeeded or
    collided, at the step it did."""
    run = _run(
        "eval_table",
        "--config=pi05_detour_moving",
        "--execution=naive",
        "--delay_steps=5",
        "--max_steps=50",
        "--episodes=2",
        f"--out={tmp_path}",
    )
    assert run.returncode == 0, run.stderr[-2000:]
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["max_steps"] == 50
    successes = sum(results["success_steps_histogram"].values())
    assert successes == round(results["success_rate"] * 2)
    assert sum(results["collision_steps_histogram"].values()) == round(results["collision_rate"] * 2)
    assert all(1 <= int(steps) <= 50 for steps in results["success_steps_histogram"])
