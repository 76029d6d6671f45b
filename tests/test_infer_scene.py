"""`infer.py --scene=SEED` on the shipped demo model: a rendered table scene in, and out the text the model
was trained to say for it (the scene's true subtask) and an action chunk."""

import subprocess
import sys

import numpy as np
import pytest
from conftest import SCRIPTS

from oxygen_jax.table_task import scenes

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def _infer(*flags: str) -> subprocess.CompletedProcess:
    command = [sys.executable, str(SCRIPTS / "infer.py"), *flags]
    return subprocess.run(command, capture_output=True, text=True, timeout=280, check=False)


# Seeds whose first scene the shipped model gets right (it says the true subtask in 30 of the first 31).
@pytest.mark.parametrize("seed", [3, scenes.HELD_OUT_SEED])
def test_the_demo_model_says_the_scenes_true_subtask(tmp_path, seed):
    out = tmp_path / "out.npz"
    run = _infer("--config=pi05_demo", f"--scene={seed}", "--max_text_tokens=12", f"--out={out}")
    assert run.returncode == 0, run.stderr[-3000:]
    scene = next(scenes.scenes(seed))
    assert f"true subtask {scene.subtask!r}" in run.stdout
    with np.load(out) as result:
        assert result["text"].tolist() == [scene.subtask]
        assert result["actions"].shape == (1, 10, 32) and np.isfinite(result["actions"]).all()


def test_scene_needs_a_table_config(tmp_path):
    run = _infer("--config=pi05_tiny", "--scene=3", "--max_text_tokens=0")
    assert run.returncode == 2
    assert run.stderr.strip() == "error: --scene renders table scenes; config 'pi05_tiny' has robot 'libero'"
