"""Episodes from where a robot that runs real-time chunking goes (`evaluation.rtc_rollouts`): each request
below the block becomes its frame, the stale actions the robot executed while it waited and the pursuit
from there, written with each frame's least clean prefix (`detour_dataset.MIN_CLEAN_PREFIX`)."""

import json
import subprocess
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest
from conftest import SCRIPTS

from oxygen_jax import config
from oxygen_jax.evaluation import closed_loop, rtc_rollouts
from oxygen_jax.table_task import detour, detour_dataset, moving_detour

STALE = 5


def _rollout() -> rtc_rollouts.Rollout:
    """A demonstration's path as if an rtc robot had driven it, asking for a chunk every 5 steps."""
    scene = next(moving_detour.scenes(11))
    positions = scene.path("left")
    return rtc_rollouts.Rollout(scene, STALE, tuple(range(0, len(positions), 5)), positions)


def test_pursuit_from_makes_up_lost_steps_at_top_speed_then_lands_on_the_cube():
    scene = next(moving_detour.scenes(3))
    far_x = 0.12 if scene.goal_at(10)[0] > 0.5 else 0.88  # across the table from the cube
    path = scene.pursuit_from(np.array([far_x, 0.44], np.float32), step=10, fast_steps=3)
    assert len(path) > 6
    moves = np.linalg.norm(np.diff(path, axis=0), axis=1)
    np.testing.assert_allclose(moves[:3], detour.MAX_MOVE, atol=1e-6)
    np.testing.assert_allclose(moves[3:-1], detour.SPEED, atol=1e-6)
    assert moves[-1] <= detour.SPEED + 1e-6
    np.testing.assert_array_equal(path[-1], scene.goal_at(10 + len(path) - 1))


def test_each_request_below_the_block_starts_an_episode_with_its_stale_actions():
    rollout = _rollout()
    below = [s for s in rollout.requests[1:] if rollout.positions[s][1] < rtc_rollouts.BELOW_BLOCK_Y]
    below = [s for s in below if s + STALE < len(rollout.positions)]
    episodes = list(rtc_rollouts.stale_episodes(rollout))
    assert [step for _, _, step, _ in episodes] == below and below
    for scene, path, step, stale in episodes:
        assert scene is rollout.scene
        assert stale == STALE
        np.testing.assert_array_equal(path[: STALE + 1], rollout.positions[step : step + STALE + 1])
        np.testing.assert_array_equal(path[-1], rollout.scene.goal_at(step + len(path) - 1))
        assert np.all(np.linalg.norm(np.diff(path, axis=0), axis=1) <= detour.MAX_MOVE + 1e-6)


def test_the_first_request_and_one_whose_stale_actions_did_not_all_run_give_none():
    rollout = _rollout()
    last = len(rollout.positions) - 2  # a request with one step left before the episode ended
    cut = rtc_rollouts.Rollout(rollout.scene, STALE, (last - 10, last), rollout.positions)
    assert list(rtc_rollouts.stale_episodes(cut)) == []


def test_stale_episodes_are_written_with_their_least_clean_prefix(tmp_path):
    rollout = _rollout()
    stale = list(rtc_rollouts.stale_episodes(rollout))
    root = detour_dataset.record_moving_dataset(tmp_path / "moving", 2, stale_episodes=stale[:1])
    info = json.loads((root / "meta" / "info.json").read_text())
    assert info["total_episodes"] == 3
    demo = pq.read_table(root / "data" / "chunk-000" / "episode_000000.parquet").to_pydict()
    assert set(np.ravel(demo[detour_dataset.MIN_CLEAN_PREFIX])) == {0.0}
    written = pq.read_table(root / "data" / "chunk-000" / "episode_000002.parquet").to_pydict()
    scene, path, step, _ = stale[0]
    least = np.ravel(written[detour_dataset.MIN_CLEAN_PREFIX])
    np.testing.assert_array_equal(least[: STALE + 2], [5, 4, 3, 2, 1, 0, 0])
    states = np.array(written["observation.state"])
    np.testing.assert_allclose(states[: len(path)], path, atol=1e-6)
    # The hold frames follow the cube from where the path caught it.
    np.testing.assert_allclose(states[-1], scene.goal_at(step + len(states) - 1), atol=1e-6)


def test_the_moving_config_trains_with_the_column_its_datasets_carry():
    cfg = config.load_config("pi05_detour_moving")
    assert cfg.data.min_clean_prefix == detour_dataset.MIN_CLEAN_PREFIX and cfg.model.max_clean_prefix == 5


def test_only_the_moving_task_takes_stale_episodes(tmp_path):
    rollout = _rollout()
    stale = list(rtc_rollouts.stale_episodes(rollout))
    with pytest.raises(ValueError, match="stale episodes are the moving task's"):
        detour_dataset.record_dataset(tmp_path / "still", 1, stale_episodes=stale)


def test_rollouts_from_is_refused_for_another_task(tmp_path):
    command = [sys.executable, str(SCRIPTS / "make_demo_dataset.py"), "--task=detour"]
    run = subprocess.run(
        [*command, "--rollouts_from=shipped", f"--out={tmp_path / 'd'}"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert run.returncode != 0
    assert "--rollouts_from is for --task=detour_moving, not --task=detour" in run.stderr


@pytest.mark.integration
def test_rollouts_of_the_shipped_model_add_their_episodes_to_the_dataset(tmp_path):
    """`--rollouts_from=shipped`: the packaged model's rtc episodes on the rollout scenes, each request
    below the block one more dataset episode, the same as `collect` and `stale_episodes` give here."""
    rollouts = rtc_rollouts.collect(closed_loop.load_policy("pi05_detour_moving", None), 3, seed=0)
    assert [r.delay for r in rollouts] == [
        int(d) for d in np.random.default_rng(0).choice(rtc_rollouts.DELAYS, 3)
    ]
    expected = sum(len(list(rtc_rollouts.stale_episodes(r))) for r in rollouts)
    assert expected > 0
    out = tmp_path / "moving"
    command = [sys.executable, str(SCRIPTS / "make_demo_dataset.py"), "--task=detour_moving", "--episodes=3"]
    flags = ["--rollouts_from=shipped", "--rollout_episodes=3", f"--out={out}"]
    run = subprocess.run([*command, *flags], capture_output=True, text=True, timeout=600, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    assert f"({expected} from rtc rollouts)" in run.stdout
    assert json.loads((out / "meta" / "info.json").read_text())["total_episodes"] == 3 + expected
