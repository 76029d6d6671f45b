"""scripts/benchmark.py --multitask on pi05_tiny: every mode is recorded with its fields, and sharing saves
prefills (counted engine calls, not time: timings on a shared CI machine mean nothing)."""

import json

import pytest
from conftest import run_benchmark

from oxygen_jax.benchmarks import multitask

# ~50 s of script run: slow. One prefill per observation for several tasks is also counted in the
# default run by tests/test_text_tasks.py.
pytestmark = pytest.mark.slow
MODE_FIELDS = ("action_hz", "tokens_per_s", "frame_ms_mean", "observations", "tokens", "engine_calls")
FRAMES = 2


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    out = tmp_path_factory.mktemp("multitask")
    run_benchmark(
        out,
        "--multitask",
        "--config=pi05_tiny",
        f"--multitask_frames={FRAMES}",
        "--multitask_seconds=2",
        "--multitask_think_ms=50",
    )
    return json.loads((out / "multitask.json").read_text())


def test_every_mode_has_the_documented_fields(result):
    assert set(result["modes"]) == {f"{s}_{d}" for s in multitask.SHARING for d in multitask.DECODING}
    for name, mode in result["modes"].items():
        assert all(field in mode for field in MODE_FIELDS), name
        assert mode["action_hz"] > 0 and mode["frame_ms_mean"] > 0, name
    for field in ("speedup_vs_isolated", "speedup_vs_isolated_async", "prefill_ms", "fraction_of_bound"):
        assert result[field] > 0, field
    assert result["cost_model"]["prefills_saved_per_observation"] == 2
    assert result["cost_model"]["speedup_bound"] > 1
    assert result["memory_per_extra_task_bytes"] > 0


def test_frame_modes_finish_every_task_of_every_frame(result):
    expected = FRAMES * sum(n for _, n, _ in multitask.TASKS)  # eos_id=-1: every task runs to its N
    for sharing in multitask.SHARING:
        mode = result["modes"][f"{sharing}_frame"]
        assert mode["texts"] == FRAMES * len(multitask.TASKS)
        assert mode["tokens"] == expected


def test_shared_prefills_once_per_observation_isolated_once_per_task(result):
    shared = result["modes"]["shared_frame"]["engine_calls"]
    isolated = result["modes"]["isolated_frame"]["engine_calls"]
    assert shared == {"prefill": FRAMES, "extend": FRAMES}  # one extension call carries all three tasks
    assert isolated == {"prefill": FRAMES * len(multitask.TASKS), "extend": FRAMES * len(multitask.TASKS)}
    for decoding in multitask.DECODING:
        s = result["modes"][f"shared_{decoding}"]
        i = result["modes"][f"isolated_{decoding}"]
        assert s["engine_calls"]["prefill"] == s["observations"]
        assert i["engine_calls"]["prefill"] > i["observations"]
