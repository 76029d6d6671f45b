"""DROID: the offline replay CLI on a synthetic stream with the tiny model, and the robot loop (camera
selection, action post-processing, operator CSV) against a stand-in RobotEnv."""

import csv
import json

import numpy as np
import pytest
from conftest import StandInPolicy, run_script

from oxygen_jax.evaluation import droid, requirements

imageio = pytest.importorskip("imageio", reason="videos need the droid extra: oxygen_jax[droid]")

pytestmark = [
    pytest.mark.timeout(180),
    # JAX warns on any fork; these forks only exec the CLI under test.
    pytest.mark.filterwarnings("ignore:os.fork\\(\\) was called:RuntimeWarning"),
]


def fixed_chunk(_: int) -> np.ndarray:
    """The stand-in policy's [10, 8] chunk at every call: gripper 0.7, one joint out of range."""
    chunk = np.zeros((10, 8))
    chunk[:, 0] = np.arange(10) / 10
    chunk[:, 1] = -3.0
    chunk[:, 7] = 0.7
    return chunk


class StandInRobotEnv:
    """DROID's RobotEnv as seen by the client: BGRA stereo images keyed by camera id, a robot state."""

    def __init__(self) -> None:
        self.steps: list[np.ndarray] = []
        self.resets = 0

    def get_observation(self) -> dict:
        def bgra(value: int) -> np.ndarray:
            image = np.zeros((72, 128, 4), np.uint8)
            image[..., 0] = value  # Blue: becomes the last RGB channel.
            return image

        return {
            "image": {
                "111_left": bgra(1),
                "111_right": bgra(2),
                "222_left": bgra(3),
                "222_right": bgra(4),
                "333_left": bgra(5),
                "333_right": bgra(6),
            },
            "robot_state": {"joint_positions": list(range(7)), "gripper_position": 0.25},
        }

    def step(self, action: np.ndarray) -> None:
        self.steps.append(action)

    def reset(self) -> None:
        self.resets += 1


class ScriptedOperator:
    def __init__(self, instructions: list[str], scores: list[float]) -> None:
        self._instructions = iter(instructions)
        self._scores = iter(scores)

    def instruction(self) -> str:
        return next(self._instructions, "")

    def success(self) -> float:
        return next(self._scores)


@pytest.mark.integration
def test_cli_replay_of_a_synthetic_stream(tmp_path):
    proc = run_script(
        "eval_droid",
        "--mode=replay",
        "--config=pi05_tiny",
        "--synthetic_frames=10",
        "--max_text_tokens=4",
        f"--out={tmp_path}",
        timeout_s=170,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "replayed 10 steps, 2 policy calls" in proc.stdout
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["mode"] == "replay"
    assert results["policy"]["metadata"]["robot"] == "droid"
    rollout = results["rollout"]
    assert rollout["steps"] == 10 and rollout["replans"] == 2
    assert [t["step"] for t in rollout["texts"]] == [0, 8]
    assert rollout["late_steps"] >= 1  # The first policy call compiles.
    assert rollout["infer_ms"]["median"] > 0
    actions = np.load(tmp_path / "actions.npz")["actions"]
    assert actions.shape == (10, 8)
    assert np.abs(actions).max() <= 1.0 and set(np.unique(actions[:, 7])) <= {0.0, 1.0}
    frames = imageio.mimread(tmp_path / rollout["video"])
    assert len(frames) == 10 and frames[0].shape == (180, 320, 3)


def test_replay_of_npz_frames_sends_openpi_requests(tmp_path):
    frames_dir = tmp_path / "frames"
    frames_dir.mkdir()
    for i, frame in enumerate(droid.synthetic_frames(3, image_size=(90, 160))):
        np.savez(frames_dir / f"{i:04d}.npz", **frame, prompt="wipe the table")
    policy = StandInPolicy(fixed_chunk)
    settings = droid.Settings(open_loop_horizon=2, control_hz=None)
    results = droid.replay(policy, droid.load_frames(frames_dir), "unused", settings, tmp_path / "out", {})
    assert len(policy.requests) == 2
    request = policy.requests[0]
    assert set(request) == {*droid.REQUIRED_KEYS, "prompt"}
    assert request["prompt"] == "wipe the table"
    for key in droid.IMAGE_KEYS:
        assert request[key].shape == (224, 224, 3) and request[key].dtype == np.uint8
    assert results["rollout"]["steps"] == 3 and results["rollout"]["late_steps"] is None
    actions = np.load(tmp_path / "out" / "actions.npz")["actions"]
    np.testing.assert_allclose(actions[:, 0], [0.0, 0.1, 0.0])  # Each chunk's head, then a new chunk.


def test_missing_replay_frames_is_a_setup_error(tmp_path):
    with pytest.raises(requirements.SetupError, match=r"no \.npz frames"):
        droid.load_frames(tmp_path)


def test_robot_loop_scores_rollouts_into_a_csv(tmp_path):
    env = StandInRobotEnv()
    policy = StandInPolicy(fixed_chunk)
    cameras = droid.Cameras(left_id="111", right_id="222", wrist_id="333", external="right")
    operator = ScriptedOperator(["pick up the cup", "open the drawer"], [1.0, 0.5])
    settings = droid.Settings(max_steps=5, open_loop_horizon=3)
    csv_path = droid.run_robot(policy, env, cameras, operator, settings, tmp_path)

    request = policy.requests[0]
    assert request["prompt"] == "pick up the cup"
    # Right exterior camera (blue 3) and wrist (blue 5), left stereo images, BGRA -> RGB.
    assert request[droid.EXTERIOR_KEY][100, 100].tolist() == [0, 0, 3]
    assert request[droid.WRIST_KEY][100, 100].tolist() == [0, 0, 5]
    np.testing.assert_array_equal(request["observation/joint_position"], np.arange(7))
    np.testing.assert_array_equal(request["observation/gripper_position"], [0.25])
    assert len(policy.requests) == 4  # Two rollouts, replanning at steps 0 and 3.
    assert len(env.steps) == 10 and env.resets == 2
    np.testing.assert_allclose(env.steps[1], [0.1, -1.0, 0, 0, 0, 0, 0, 1.0])

    with csv_path.open() as f:
        rows = list(csv.DictReader(f))
    assert [(r["prompt"], float(r["success"]), int(r["steps"])) for r in rows] == [
        ("pick up the cup", 1.0, 5),
        ("open the drawer", 0.5, 5),
    ]
    assert [t["text"] for t in json.loads(rows[1]["texts"])] == ["call 3", "call 4"]
    assert float(rows[0]["control_hz"]) <= droid.CONTROL_HZ + 1
    assert (tmp_path / rows[0]["video"]).is_file()


def test_robot_mode_without_the_droid_stack_says_so():
    with pytest.raises(requirements.MissingDependencyError, match="--mode=replay"):
        droid.load_robot_env()


def test_robot_command_binarizes_the_gripper_and_clips():
    np.testing.assert_array_equal(
        droid.to_robot_command(np.array([2.0, -2.0, 0.3, 0, 0, 0, 0, 0.51])),
        [1.0, -1.0, 0.3, 0, 0, 0, 0, 1.0],
    )
    assert droid.to_robot_command(np.full(8, 0.5))[-1] == 0.0
    with pytest.raises(ValueError, match="8-d DROID actions"):
        droid.to_robot_command(np.zeros(7))


def test_recorded_rollouts_are_a_lerobot_dataset_the_trainer_reads(tmp_path):
    from oxygen_jax.lerobot.reader import LeRobotDataset
    from oxygen_jax.lerobot.writer import LeRobotWriter
    from oxygen_jax.training.data.examples import Columns, FrameSource

    policy = StandInPolicy(fixed_chunk)
    cameras = droid.Cameras(left_id="111", right_id="222", wrist_id="333", external="left")
    operator = ScriptedOperator(["pick up the cup", "open the drawer"], [1.0, 0.0])
    settings = droid.Settings(max_steps=5, open_loop_horizon=3, save_video=False)
    recorder = LeRobotWriter(tmp_path / "data", fps=droid.CONTROL_HZ, robot_type="droid")
    droid.run_robot(policy, StandInRobotEnv(), cameras, operator, settings, tmp_path, recorder)

    dataset = LeRobotDataset(tmp_path / "data")
    assert [e.length for e in dataset.episodes] == [5, 5]
    assert sorted(dataset.tasks.values()) == ["open the drawer", "pick up the cup"]
    episode = dataset.read_episode(dataset.episodes[1], [droid.WRIST_KEY, "action", "text"])
    assert episode[droid.WRIST_KEY].shape == (5, 224, 224, 3)
    assert episode[droid.WRIST_KEY][0, 100, 100].tolist() == [0, 0, 5]
    # The model's actions (before the robot command): each chunk's head, replanning at step 3.
    np.testing.assert_allclose(episode["action"][:, 0], [0.0, 0.1, 0.2, 0.0, 0.1], atol=1e-7)
    assert episode["text"] == ["call 3"] * 3 + ["call 4"] * 2

    columns = {
        key: key for key in (*droid.IMAGE_KEYS, "observation/joint_position", "observation/gripper_position")
    }
    frame = FrameSource(dataset, Columns(repack=columns, subtask="text"), action_horizon=4).frame(3)
    assert frame["prompt"] == "pick up the cup" and frame["subtask"] == "call 2"
    np.testing.assert_allclose(frame["actions"][:, 0], [0.0, 0.1, 0.1, 0.1], atol=1e-7)
    np.testing.assert_array_equal(frame["observation/joint_position"], np.arange(7))
