"""scripts/benchmark.py --serving on pi05_tiny: every setting and mode is recorded with the fields the
docs name, action_only serves no language, the language modes start texts; the plot draws the sweep.
Counts and fields only: timings on a shared CI machine mean nothing."""

import json

import pytest
from conftest import run_benchmark

from oxygen_jax.benchmarks import plots, serving

FIELDS = (
    "action_latency_ms_p50",
    "action_latency_ms_p99",
    "text_latency_ms_p50",
    "tokens_per_s",
    "idle_decode_tokens_per_s",
    "own_text_fraction",
    "busy_fraction",
)


@pytest.fixture(scope="module")
def result(tmp_path_factory):  # ~70 s: the tests that run the script are slow
    out = tmp_path_factory.mktemp("serving")
    run_benchmark(
        out,
        "--serving",
        "--config=pi05_tiny",
        "--serving_seconds=2",
    )
    return json.loads((out / "serving.json").read_text())


@pytest.mark.slow
def test_every_setting_and_mode_has_the_documented_fields(result):
    assert set(result["settings"]) == {"R1_T300", "R4_T0"}
    for name, setting in result["settings"].items():
        assert set(setting["modes"]) == set(serving.MODES), name
        for mode, record in setting["modes"].items():
            assert all(field in record for field in FIELDS), (name, mode)
            assert record["observations"] > 0 and record["action_latency_ms_p50"] > 0, (name, mode)
        assert all(device["live_bytes"] > 0 for device in setting["device_bytes"].values()), name


@pytest.mark.slow
def test_only_the_language_modes_serve_text(result):
    for name, setting in result["settings"].items():
        modes = setting["modes"]
        assert modes["action_only"]["tokens_per_s"] == 0 and modes["action_only"]["own_text_fraction"] == 0
        for mode in ("frame", "async"):
            assert modes[mode]["own_text_fraction"] > 0, (name, mode)


def _setting(robots: int, think_ms: float) -> dict:
    modes = {
        mode: {
            "action_latency_ms_p99": 400.0 + think_ms,
            "text_latency_ms_p50": None if mode == "action_only" else 500.0,
            "tokens_per_s": 0.0 if mode == "action_only" else 10.0 + think_ms / 10,
        }
        for mode in serving.MODES
    }
    return {"setting": {"robots": robots, "think_ms": think_ms}, "modes": modes}


def test_plot_draws_latency_and_tokens_against_think_time(tmp_path):
    one_each = {"settings": {"R1_T300": _setting(1, 300.0), "R4_T0": _setting(4, 0.0)}}
    assert plots.serving(one_each, tmp_path) is None  # one think time per robot count: nothing to draw
    sweep = {"settings": {f"R1_T{t:g}": _setting(1, t) for t in (0.0, 100.0, 300.0)}}
    path = plots.serving(sweep, tmp_path)
    assert path == tmp_path / "serving.png" and path.stat().st_size > 10_000
