"""scripts/benchmark.py on pi05_tiny: every mode runs in its own processes and the outputs are complete.

Timings on a shared CI machine mean nothing here; the tests check what the benchmark records, not speed.
"""

import json
import pathlib

import pytest
from conftest import run_benchmark

from oxygen_jax.benchmarks import spec, sweeps

RUN_FIELDS = (
    "frame_ms_mean",
    "frame_ms_p50",
    "frame_ms_p99",
    "action_hz",
    "tokens_per_s",
    "avg_batch",
    "peak_memory_bytes",
    "live_bytes_peak",
    "compiles_after_warmup",
    "processes",
    "spec",
)


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    run_benchmark(
        out,
        "--config=pi05_tiny",
        "--sweeps=ablation,n_k",
        "--max_text_tokens=5",
        "--k=5",
        "--frames=2",
    )
    return out


def _runs(out: pathlib.Path) -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in (out / "runs").glob("*.json")}


@pytest.mark.integration
def test_every_mode_runs_with_documented_fields(results):
    runs = _runs(results)
    ablation = {
        r["spec"]["mode"] + ("_deadline" if r["spec"]["target_hz"] else ""): r
        for r in runs.values()
        if r["spec"]["sweep"] == "ablation"
    }
    assert set(ablation) == {*spec.MODES, "oxygen_deadline"}
    for record in runs.values():
        assert set(RUN_FIELDS) <= record.keys(), record["name"]
        assert record["compiles_after_warmup"] == 0, record["name"]
        assert record["frames"] == 2 and record["action_hz"] > 0
    assert ablation["parallel"]["processes"] == 2
    assert all(r["processes"] == 1 for m, r in ablation.items() if m != "parallel")
    # Same requests in every mode; in-frame modes finish each frame's request inside the frame.
    for mode in ("isolated", "parallel", "shared_kv"):
        assert ablation[mode]["requests_completed"] == 2
        assert ablation[mode]["tokens"] == 2 * 30
    assert ablation["oxygen"]["tokens"] > 0 and ablation["action_only"]["tokens"] == 0
    assert ablation["oxygen"]["state_bytes"] > 0 and ablation["oxygen"]["slots"] == 6


@pytest.mark.integration
def test_quick_json_schema(results):
    quick = json.loads((results / "quick.json").read_text())
    assert set(sweeps.QUICK_MODES) <= quick["modes"].keys()
    for figures in quick["modes"].values():
        assert {"frame_ms_mean", "action_hz", "tokens_per_s"} <= figures.keys()
    assert quick["speedup_vs_isolated"] > 0 and quick["speedup_bound"] > 0
    assert quick["targets"]["compiles_after_warmup"] == {"value": 0, "target": 0, "met": True}
    assert quick["memory"]["state_bytes"] > 0


@pytest.mark.integration
def test_roofline_and_report(results):
    roof = json.loads((results / "roofline.json").read_text())
    assert roof["machine"]["matmul_flops_per_s"] > 0 and roof["machine"]["bandwidth_bytes_per_s"] > 0
    phases = {p["phase"] for p in roof["phases"]}
    assert {"vision", "prefill", "denoise", "decode_step_b1", "decode_step_b4"} <= phases
    assert all(p["floor_ms"] > 0 and p["bound"] in ("compute", "bandwidth") for p in roof["phases"])
    # Decode steps also sit against the rate the dot kernels stream the model's MLP weights at their batch.
    assert {"b1", "b4"} <= roof["mlp_stream_bytes_per_s"].keys()
    decode = [p for p in roof["phases"] if p["phase"].startswith("decode_step_b")]
    assert decode and all(p["stream_floor_ms"] > 0 and p["x_stream_floor"] > 0 for p in decode)
    # On CPU the same matmuls also run in numpy's BLAS, the reference for what the machine's GEMMs reach.
    assert roof["blas"] and roof["blas_stream_bytes_per_s"].keys() == roof["mlp_stream_bytes_per_s"].keys()
    assert all(rate > 0 for rate in roof["blas_stream_bytes_per_s"].values())
    report = (results / "results.md").read_text()
    assert "| ablation | oxygen |" in report
    assert roof["processor"] in report and f"numpy's BLAS ({roof['blas']})" in report
    for plot in ("ablation", "speedup_vs_n_k", "tradeoff", "roofline"):
        assert (results / f"{plot}.png").stat().st_size > 0


def test_quick_is_the_libero_ablation_point():
    specs = sweeps.quick(frames=20)
    assert [s.mode for s in specs] == list(sweeps.QUICK_MODES)
    for s in specs:
        assert (s.layout, s.num_steps, s.max_new, s.k, s.arrivals, s.rate) == (
            "libero",
            10,
            30,
            5,
            "uniform",
            1.0,
        )
        assert s.skip_masked_cameras and s.target_hz is None


def test_every_mode_sees_the_same_requests():
    load = {"arrivals": "random_length", "rate": 2.0, "lengths": (5, 20), "long_fraction": 0.3}
    schedules = [spec.RunSpec(mode, **load).schedule() for mode in spec.MODES]
    assert all(s == schedules[0] for s in schedules)
    assert {n for frame in schedules[0] for n in frame} == {5, 20}
