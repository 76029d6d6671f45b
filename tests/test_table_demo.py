"""The demo table task: scenes, truths and sentences the stand-in tokenizer spells; the shipped demo model
against its targets on held-out scenes (slow)."""

import itertools
import pathlib

import numpy as np

from oxygen_jax import config
from oxygen_jax.evaluation import table_scenes
from oxygen_jax.tokenizer import Tokenizer

REPO = pathlib.Path(__file__).resolve().parents[1]


def test_subtask_names_the_prompted_cube_and_its_slot():
    scene = table_scenes.Scene(
        ("green", "red", "blue"), np.array([[0.2, 0.3], [0.5, 0.3], [0.8, 0.3]], np.float32), target=2
    )
    assert scene.prompt == "pick up the blue cube"
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
