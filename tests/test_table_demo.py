"""The demo table task: scenes, truths and sentences the stand-in tokenizer spells; the shipped demo model
against its targets on held-out scenes (slow)."""

import itertools
import json
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from oxygen_jax import config
from oxygen_jax.models import siglip
from oxygen_jax.table_task import scenes as table_scenes
from oxygen_jax.tokenizer import Tokenizer

REPO = pathlib.Path(__file__).resolve().parents[1]


def test_subtask_names_the_colour_of_the_cube_in_the_prompted_place():
    scene = table_scenes.Scene(
        ("green", "red", "blue"), np.array([[0.2, 0.3], [0.5, 0.3], [0.8, 0.3]], np.float32), target=2
    )
    assert scene.prompt == "pick up the cube on the right"
    assert scene.subtask == "reach the blue cube on the right"
    assert table_scenes.Scene(scene.colours, scene.positions, 1).subtask == "reach the red cube in the middle"


def test_actions_move_in_a_straight_line_to_the_cube_and_stay():
    scene = next(table_scenes.scenes(3))
    chunk = scene.action_chunk(0, 10)
    steps = table_scenes.STEPS
    np.testing.assert_allclose(
        chunk[steps - 1 :], np.broadcast_to(scene.goal, (10 - steps + 1, 2)), atol=1e-6
    )
    deltas = np.diff(np.concatenate([table_scenes.GRIPPER_START[None], chunk[:steps]]), axis=0)
    np.testing.assert_allclose(deltas, np.broadcast_to(deltas[0], deltas.shape), atol=1e-6)


def test_render_draws_each_cube_in_its_colour_and_the_gripper():
    scene = next(table_scenes.scenes(4))
    image = table_scenes.render(scene, table_scenes.GRIPPER_START)
    for colour, (x, y) in zip(scene.colours, scene.positions, strict=True):
        assert image[int(y * 224), int(x * 224)].tolist() == list(table_scenes.COLOURS[colour])
    ring_x = int((table_scenes.GRIPPER_START[0] + 0.04) * 224)
    assert image[int(table_scenes.GRIPPER_START[1] * 224), ring_x].tolist() == [30, 30, 30]


def test_each_slot_stays_in_its_own_patch_columns_of_the_demo_vision_tower():
    """pi05_demo's SigLIP cuts the image into columns of patches (4 of 56 pixels): the left cube must stay
    in the first, the right cube in the last and the middle cube in the inner ones, whatever the jitter."""
    patch = siglip.siglip_variant(config.load_config("pi05_demo").model.vision).patch_size
    size = table_scenes.IMAGE_SIZE
    allowed = {0: (0, patch), 1: (patch, size - patch), 2: (size - patch, size)}
    scenes = table_scenes.scenes(7)
    for _ in range(300):
        scene = next(scenes)
        image = table_scenes.render(scene, table_scenes.GRIPPER_START)
        for slot, colour in enumerate(scene.colours):
            columns = np.flatnonzero((image == table_scenes.COLOURS[colour]).all(-1).any(0))
            low, high = allowed[slot]
            assert columns.size and low <= columns.min() and columns.max() < high, (slot, columns)


def test_stand_in_tokenizer_spells_every_demo_sentence_within_the_token_budget():
    cfg = config.load_config("pi05_demo")
    tokenizer = Tokenizer(cfg.tokenizer_path, max_len=cfg.model.max_token_len)
    for colours in itertools.permutations(table_scenes.COLOURS, 3):
        for target in range(3):
            scene = table_scenes.Scene(colours, np.zeros((3, 2), np.float32), target)
            ids, mask = tokenizer.tokenize(scene.prompt)
            target_ids = tokenizer.tokenize_target(scene.subtask)
            assert tokenizer.detokenize(target_ids) == scene.subtask
            assert tokenizer.detokenize(ids[mask][1:]).strip() == scene.prompt
            assert mask.sum() + len(target_ids) <= cfg.model.max_token_len


@pytest.fixture(scope="module")
def demo_report(tmp_path_factory):
    """scripts/train.py --eval_only on the shipped demo model: its demo_eval.json."""
    out = tmp_path_factory.mktemp("demo_eval")
    command = [sys.executable, str(REPO / "scripts" / "train.py"), "--config=pi05_demo", "--eval_only"]
    proc = subprocess.run(
        [*command, f"--out={out}"], capture_output=True, text=True, timeout=1700, check=False, cwd=REPO
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads((out / "demo_eval.json").read_text())


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_shipped_demo_model_moves_to_the_cube(demo_report):
    assert demo_report["trained"]["action_mse"] <= 0.1 * demo_report["untrained"]["action_mse"]


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_shipped_demo_model_says_the_true_subtask(demo_report):
    assert demo_report["untrained"]["subtask_exact_match"] < 0.5
    assert demo_report["trained"]["subtask_exact_match"] >= 0.9
