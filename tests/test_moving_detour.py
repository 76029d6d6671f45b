"""The moving detour task: the cube's motion, the pursuit demonstrations, the world that moves with the
simulated clock, the dataset it writes, and the config that runs it."""

import itertools
import json
import subprocess
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest
from conftest import SCRIPTS

from oxygen_jax import config
from oxygen_jax.client import protocol
from oxygen_jax.client.executor import SimClock
from oxygen_jax.evaluation import closed_loop
from oxygen_jax.table_task import detour, moving_detour

H = 10
E = 6


def test_the_cube_moves_every_step_at_its_speed_and_bounces_inside_its_lane():
    for scene in itertools.islice(moving_detour.scenes(4), 50):
        xs = np.array([scene.goal_at(step)[0] for step in range(200)])
        low, high = moving_detour.LANE
        assert (xs >= low - 1e-6).all() and (xs <= high + 1e-6).all()
        steps = np.abs(np.diff(xs))
        assert (steps > 0).all() and (steps <= abs(scene.velocity) + 1e-6).all()
        assert moving_detour.SPEED_RANGE[0] <= abs(scene.velocity) <= moving_detour.SPEED_RANGE[1]
        # 200 steps cover more than the lane: the cube turns back at an edge.
        assert len(set(np.sign(np.diff(xs)))) == 2
        np.testing.assert_allclose(scene.goal_at(0), scene.still.goal, atol=1e-6)
        assert (scene.at(7).goal == scene.goal_at(7)).all() and (scene.at(7).block == scene.still.block).all()


def test_demonstrations_go_around_and_catch_the_cube_within_the_budget():
    for scene in itertools.islice(moving_detour.scenes(5), 100):
        for side in detour.SIDES:
            path = scene.path(side)
            n = len(path) - 1
            np.testing.assert_array_equal(path[-1], scene.goal_at(n))
            assert n <= moving_detour.MAX_STEPS - 5
            assert np.linalg.norm(np.diff(path, axis=0), axis=1).max() <= detour.SPEED + 1e-6
            assert not any(scene.still.collides(a, b) for a, b in itertools.pairwise(path))
            beside = path[np.abs(path[:, 1] - scene.still.block[1]) <= detour.BLOCK_HALF[1]][:, 0]
            assert len(beside) and ((beside < scene.still.block[0]) == (side == "left")).all()


def _first_reach(scene: moving_detour.MovingDetourScene, path: np.ndarray) -> int | None:
    reached = [step for step, p in enumerate(path) if scene.at(step).reached(p)]
    return reached[0] if reached else None


def test_standing_still_while_chunks_are_computed_misses_most_cubes():
    """The demonstration with the gripper standing still 5 of every 9 steps (sync at d = 5 with H = 10:
    4 actions per chunk) misses most cubes within the budget; at 2 of every 6 it still makes most."""
    made = {}
    for delay in (2, 5):
        stalls = frozenset(k for k in range(200) if k % (H - E + delay) >= H - E)
        reaches = [
            _first_reach(scene, scene.path(side, stalls))
            for scene in itertools.islice(moving_detour.scenes(6), 100)
            for side in detour.SIDES
        ]
        made[delay] = np.mean([r is not None and r <= moving_detour.MAX_STEPS for r in reaches])
    assert made[5] < 0.2 and made[2] > 0.6


def test_recovery_paths_overshoot_then_catch_the_cube():
    scene = next(moving_detour.scenes(7))
    path = scene.recovery_path("right", turn_y=0.7)
    assert path[:, 1].min() < 0.7 and np.isclose(path[:, 1], 0.7).sum() >= 2
    np.testing.assert_array_equal(path[-1], scene.goal_at(len(path) - 1))
    assert not any(scene.still.collides(a, b) for a, b in itertools.pairwise(path))


def test_the_world_moves_the_cube_with_the_clock_and_scores_its_current_position():
    scene = next(moving_detour.scenes(8))
    clock = SimClock()
    world = closed_loop.MovingDetourWorld(scene, clock)
    np.testing.assert_array_equal(world.scene.goal, scene.goal_at(0))
    clock.sleep_until(3 / closed_loop.CONTROL_HZ)  # three steps waited: the cube moved on
    np.testing.assert_allclose(world.scene.goal, scene.goal_at(3), atol=1e-6)
    image = world.observe()["observation/image"]
    np.testing.assert_array_equal(image, scene.observation(world.gripper, 3)["observation/image"])
    # A gripper on the cube's first position no longer reaches it once it has moved away.
    world.gripper = scene.goal_at(0).copy()
    clock.sleep_until(10 / closed_loop.CONTROL_HZ)
    assert not world.done
    world.gripper = scene.goal_at(10).copy()
    assert world.done


def test_observations_show_the_cube_now_over_its_trail():
    still = detour.DetourScene(*(np.array(p, np.float32) for p in ((0.5, 0.9), (0.5, 0.52), (0.5, 0.17))))
    scene = moving_detour.MovingDetourScene(still, velocity=0.02)
    image = scene.observation(np.array([0.5, 0.9], np.float32), 5)["observation/image"]
    size = image.shape[0]

    def pixel(x: float, y: float) -> list[int]:
        return image[int(y * size), int(x * size)].tolist()

    cube, trail = scene.goal_at(5), scene.goal_at(5 - moving_detour.TRAIL_STEPS)
    assert pixel(*cube) == [215, 40, 40]
    behind = trail[0] - 0.06  # covered by the trail, not by the cube
    assert pixel(behind, trail[1]) != pixel(0.95, 0.95) and pixel(behind, trail[1]) != [215, 40, 40]


class _Oracle:
    """The demonstration: the next H positions after the one the gripper is at."""

    def __init__(self, path: np.ndarray):
        self.path, self.chunks = path, 0

    def __call__(self, obs: dict) -> dict:
        here = int(np.argmin(np.linalg.norm(self.path - obs["observation/state"], axis=1)))
        self.chunks += 1
        return {
            "actions": self.path[np.minimum(np.arange(here + 1, here + 1 + H), len(self.path) - 1)],
            protocol.CHUNK_ID: self.chunks - 1,
            protocol.START: 0,
            protocol.STALE: False,
        }


def test_the_demonstration_succeeds_in_closed_loop_under_exact_stepping():
    for scene in itertools.islice(moving_detour.scenes(9), 5):
        path = scene.path("left")
        episode = closed_loop.run_episode(
            _Oracle(path),
            scene,
            execution="naive",
            delay_steps=0,
            execution_horizon=E,
            max_steps=moving_detour.MAX_STEPS,
        )
        assert episode.success and episode.side == "left"
        assert episode.steps == _first_reach(scene, path)


def test_make_demo_dataset_writes_the_moving_task(tmp_path):
    out = tmp_path / "moving"
    command = [sys.executable, str(SCRIPTS / "make_demo_dataset.py"), "--task=detour_moving", "--episodes=3"]
    run = subprocess.run([*command, f"--out={out}"], capture_output=True, text=True, timeout=300, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    assert json.loads((out / "meta" / "info.json").read_text())["total_episodes"] == 3
    episode = pq.read_table(out / "data" / "chunk-000" / "episode_000000.parquet").to_pydict()
    scene = next(moving_detour.scenes(detour.TRAIN_SEED))
    states, actions = np.array(episode["observation.state"]), np.array(episode["action"])
    np.testing.assert_allclose(states[1:], actions[:-1], atol=1e-6)  # the action: the next position
    # The last frames hold the gripper on the cube as it moves on.
    end = len(states) - 1
    np.testing.assert_allclose(states[end], scene.goal_at(end), atol=1e-6)
    assert not np.allclose(states[end], states[end - 1])
    recovery = pq.read_table(out / "data" / "chunk-000" / "episode_000002.parquet").to_pydict()
    assert recovery["observation.state"][0][1] < detour.SPLIT_Y


def test_config_runs_the_moving_task_from_its_shipped_checkpoint():
    cfg = config.load_config("pi05_detour_moving")
    assert cfg.table_task == "detour_moving" and cfg.checkpoint_dir.endswith("assets/pi05_detour_moving")
    prefix = config.load_config("pi05_detour_prefix")
    assert prefix.table_task == "detour"
    assert (
        cfg.model.max_clean_prefix == prefix.model.max_clean_prefix and cfg.rtc.samples == prefix.rtc.samples
    )


@pytest.mark.integration
def test_a_longer_budget_holds_the_shorter_runs_episodes_cut_short():
    """The shipped moving model at d = 5, one run to 60 steps and one to the task's 42: every episode
    stops at success or collision and nothing else depends on the budget, so the longer run's histograms
    give the shorter run's success and collision rates exactly (what docs/rtc.md's budget curves rely on)."""
    policy = closed_loop.load_policy("pi05_detour_moving", None)
    common = dict(
        execution="rtc", delay_steps=5, episodes=12, seed=0, execution_horizon=6, task="detour_moving"
    )
    long = closed_loop.evaluate(policy, max_steps=60, **common)
    short = closed_loop.evaluate(policy, **common)
    assert short["max_steps"] == moving_detour.MAX_STEPS
    assert closed_loop.success_within(long, moving_detour.MAX_STEPS) == short["success_rate"]
    cut = {k: v for k, v in long["success_steps_histogram"].items() if int(k) <= moving_detour.MAX_STEPS}
    assert cut == short["success_steps_histogram"]
    assert long["collision_steps_histogram"] == short["collision_steps_histogram"]
    assert long["success_rate"] > short["success_rate"]  # these scenes include some only caught after 42
