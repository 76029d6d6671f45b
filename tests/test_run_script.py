"""`scripts/run.py --loop`: closed-loop robots with think time on the device loop, end to end."""

import json
import pathlib
import subprocess
import sys

import pytest
from conftest import GOLDEN

RUN = pathlib.Path(__file__).resolve().parents[1] / "scripts" / "run.py"
TOKENIZER = GOLDEN / "tokenizer" / "tiny_paligemma_standin.model"


@pytest.mark.slow  # compiles the tiny model's prefill, decode and insert shapes in a fresh process
@pytest.mark.timeout(600)
@pytest.mark.parametrize("loop", ["async", "frame"])
def test_robots_with_think_time_get_actions_and_text(tmp_path, loop):
    summary = tmp_path / "summary.json"
    command = [
        sys.executable,
        str(RUN),
        "--config=pi05_tiny",
        f"--checkpoint_dir={GOLDEN / 'checkpoint'}",
        f"--tokenizer_path={TOKENIZER}",
        f"--loop={loop}",
        "--robots=2",
        "--think_ms=20",
        "--seconds=3",
        "--max_text_tokens=4",
        f"--out={summary}",
    ]
    run = subprocess.run(command, capture_output=True, text=True, timeout=580, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(summary.read_text())
    assert result["mode"] == loop and result["setting"] == "R2_T20"
    assert result["observations"] > 2 and result["tokens_per_s"] > 0
    assert result["action_latency_ms_p50"] > 0 and 0 < result["own_text_fraction"] <= 1
