"""scripts/gpu_lab.sh --smoke: the GPU lab's whole path on CPU with pi05_tiny, so it cannot rot before a
GPU arrives; the test reads back what the lent machine would return."""

import json
import os
import pathlib
import subprocess
import sys

import jax
import numpy as np
import pytest

from oxygen_jax.benchmarks import lab
from oxygen_jax.benchmarks.lab import model_config as pi05_config
from oxygen_jax.models import pi05

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_smoke_run_returns_every_stage(tmp_path):
    out = tmp_path / "out"
    run = subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu_lab.sh"), "--smoke", str(out)],
        env={**os.environ, "PYTHON": sys.executable, "GPU_BUDGET_S": "300"},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert sorted(p.name for p in out.iterdir()) == [
        "log_tail.txt",
        "phases.png",
        "results.md",
        "summary.json",
    ]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["device"] == "cpu" and summary["command"].startswith("python -m oxygen_jax.tools.gpu_lab")
    (tiny,) = summary["runs"]
    assert (tiny["config"], tiny["action_horizon"], tiny["cameras"]) == (
        "pi05_tiny",
        10,
        ["base_0_rgb", "left_wrist_0_rgb"],
    )
    phases = tiny["phases"]
    for name in ("vision", "prefill", "denoise", "decode_step_b1"):
        assert phases[name]["floor_ms"] > 0 and phases[name]["x_floor"] > 0
    for name in ("action_frame", "action_frame_two_programs", "oxygen_frame", "decode_step_b6"):
        assert phases[name]["min_ms"] <= phases[name]["median_ms"]
        assert phases[name]["profile"]["where"] == "host" and phases[name]["profile"]["kernels_per_call"] > 0
    variants = {v["name"]: v for v in tiny["variants"]}
    assert variants["attention=cudnn"]["skipped"] == "GPU only"
    for name in ("attention=blocks", "attention=concat", "unroll_loops", "no_prompt_buckets"):
        # Every variant computes the default's actions to float32 rounding on CPU.
        assert variants[name]["max_rel_diff"] < 1e-5, variants[name]
    assert {(a["shape"], a["impl"]) for a in tiny["attention"]} >= {
        (shape, impl)
        for shape in ("vision", "prefill", "flow_step", "decode")
        for impl in ("blocks", "concat", "jax.nn.dot_product_attention")
    }
    text = (out / "results.md").read_text()
    assert "| denoise |" in text and "| unroll_loops |" in text and "| flow_step | concat |" in text


def test_live_params_leave_no_matrix_zero():
    """openpi's init zeroes the adaRMS modulations (the action expert would ignore the prefix); the lab's
    params fill every all-zero matrix and keep every other leaf as it was."""
    model = pi05_config("pi05_tiny")
    initialized = pi05.init_params(model, jax.random.key(0), stacked=False)
    zero = [x for x in jax.tree.leaves(initialized) if x.ndim > 1 and not x.any()]
    assert zero, "openpi's init has zero matrices (else this test checks nothing)"
    params = lab.live_params(initialized)
    assert jax.tree.structure(params) == jax.tree.structure(initialized)
    for before, after in zip(jax.tree.leaves(initialized), jax.tree.leaves(params), strict=True):
        if before.ndim > 1 and not before.any():
            assert after.any() and float(np.abs(after).max()) < 0.2
        else:
            np.testing.assert_array_equal(after, before)
