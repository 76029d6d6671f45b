"""The detour task's diagnosis scripts (scripts/detour_*.py, plot_detour_tradeoff.py) run from the checkout
and write what docs/rtc.md and BENCHMARKS.md quote: the closed-loop ones on a few episodes of the shipped
models, the plot on made-up records."""

import json
import subprocess
import sys

import pytest
from conftest import SCRIPTS


def _run(script: str, *args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, str(SCRIPTS / f"{script}.py"), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)


@pytest.mark.parametrize(
    ("script", "flags"),
    [
        ("detour_collisions", []),
        ("detour_first_chunks", ["--config=pi05_detour"]),
        ("detour_chunk_error", []),
    ],
)
def test_a_diagnosis_needs_its_output_file(script, flags):
    run = _run(script, *flags)
    assert run.returncode != 0 and "--out" in run.stderr, run.stderr[-2000:]


@pytest.mark.integration  # runs the shipped models
@pytest.mark.timeout(600)
def test_collisions_writes_one_row_per_setting(tmp_path):
    out = tmp_path / "collisions.json"
    run = _run("detour_collisions", "--episodes=1", f"--out={out}")
    assert run.returncode == 0, run.stderr[-2000:]
    rows = json.loads(out.read_text())
    assert [(r["execution"], r["delay_steps"], r["execution_horizon"]) for r in rows][:3] == [
        ("sync", 0, 6),
        ("naive", 4, 6),
        ("rtc", 4, 6),
    ]
    assert all(r["episodes"] == 1 and 0 <= r["after_a_side_change"] <= r["collisions"] <= 1 for r in rows)
    assert "| mode | d | E | collisions (of 1) |" in run.stdout


@pytest.mark.integration  # runs the shipped models
@pytest.mark.timeout(600)
def test_first_chunks_names_the_config_not_its_file(tmp_path):
    out = tmp_path / "first_chunks.json"
    run = _run("detour_first_chunks", "--config=pi05_detour", "--episodes=2", f"--out={out}")
    assert run.returncode == 0, run.stderr[-2000:]
    row = json.loads(out.read_text())
    assert (row["config"], row["checkpoint_dir"], row["starts"]) == ("pi05_detour", None, 2)
    assert row["collisions_after_averaged"] + row["collisions_after_a_side"] <= 2


@pytest.mark.integration  # runs the shipped models
@pytest.mark.timeout(600)
def test_chunk_error_gives_each_model_an_error_per_chunk_index(tmp_path):
    out = tmp_path / "chunk_error.json"
    run = _run("detour_chunk_error", "--episodes=1", f"--out={out}")
    assert run.returncode == 0, run.stderr[-2000:]
    rows = json.loads(out.read_text())
    models, scene_sets = ("pi05_detour", "pi05_detour_wide"), ("held-out", "training")
    assert [(r["model"], r["scenes"]) for r in rows] == [(m, s) for m in models for s in scene_sets]
    assert all(len(r["mean"]) == len(r["p95"]) == 10 and min(r["mean"]) >= 0 for r in rows)


def _record(folder, jump: float, success: float) -> None:
    folder.mkdir(parents=True)
    (folder / "results.json").write_text(json.dumps({"switch_jump_mean": jump, "success_rate": success}))


def test_tradeoff_plot_draws_the_recorded_runs(tmp_path):
    runs = tmp_path / "closed_loop" / "diagnosis"
    for d in (3, 5):
        for mode in ("sync", "naive", "rtc"):
            _record(tmp_path / "closed_loop" / f"{mode}_d{d}", 0.1, 0.9)
        _record(runs / f"rtc_d{d}_beta2", 0.05, 0.8)
    for d in (2, 3):
        for name in ("sync", "naive", "rtc", "rtc_ones_b7"):
            _record(runs / f"{name}_d{d}_e5_1000", 0.1, 0.95)
    out = tmp_path / "tradeoff.png"
    run = _run("plot_detour_tradeoff", f"--runs={runs}", f"--out={out}")
    assert run.returncode == 0, run.stderr[-2000:]
    png = out.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
