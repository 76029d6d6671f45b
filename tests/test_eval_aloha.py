"""ALOHA sim evaluation end to end with the tiny random-init model: the CLI with an in-process policy, and
the CLI as an openpi client of the policy server; plus the loop's pieces on a stand-in policy."""

import json
import os
import subprocess

import imageio
import numpy as np
import pytest
from conftest import CLOSED_LOOP_FIELDS, OPENPI_CLIENT_WARNING, StandInPolicy, run_script

from oxygen_jax.client import MODES
from oxygen_jax.evaluation import aloha_latency, aloha_sim, chunking, rendering, requirements

MAX_TEXT_TOKENS = 4

pytestmark = [
    pytest.mark.timeout(240),
    # JAX warns on any fork; these forks only exec the CLI under test.
    pytest.mark.filterwarnings("ignore:os.fork\\(\\) was called:RuntimeWarning"),
    OPENPI_CLIENT_WARNING,
]


@pytest.fixture(scope="module")
def simulator():
    """CI installs the `aloha` extra, so there a missing simulator or renderer fails instead of skipping."""
    try:
        rendering.configure_mujoco_gl()
        requirements.require("gym_aloha", install=aloha_sim.INSTALL, purpose="the ALOHA simulation")
    except requirements.MissingDependencyError as error:
        if os.environ.get("CI"):
            raise
        pytest.skip(str(error))


def counting_policy() -> StandInPolicy:
    """A stand-in whose chunk rows count the calls, so replans show in the actions."""
    return StandInPolicy(lambda calls: np.full((10, 14), calls, np.float32))


def run_cli(*args: str) -> subprocess.CompletedProcess:
    proc = run_script("eval_aloha", *args, timeout_s=200)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


def run_cli_failing(*args: str) -> str:
    """Runs the CLI expecting a one-line user error (exit 2, no traceback); returns its stderr."""
    proc = run_script("eval_aloha", *args, timeout_s=120)
    assert proc.returncode == 2, proc.stderr[-4000:]
    assert "Traceback" not in proc.stderr
    return proc.stderr


def check_episode(episode: dict, steps: int, replan_steps: int) -> None:
    assert episode["success"] is False  # Random weights do not transfer cubes.
    assert episode["max_reward"] == 0.0
    if "physics_error" in episode:  # random weights may also throw the arms out of the simulation
        assert episode["physics_error"].startswith(f"physics diverged at step {episode['steps']}:")
        steps = episode["steps"]
    assert episode["steps"] == steps
    assert episode["control_hz"] > 0
    replans = -(-steps // replan_steps)
    assert episode["replans"] == replans
    assert [t["step"] for t in episode["texts"]] == [replan_steps * i for i in range(replans)]
    assert all(isinstance(t["text"], str) for t in episode["texts"])


@pytest.mark.integration
def test_cli_local_episode_writes_results_and_video(simulator, tmp_path):
    run_cli(
        "--config=pi05_tiny",
        "--episodes=1",
        "--max_steps=20",
        f"--out={tmp_path}",
        f"--max_text_tokens={MAX_TEXT_TOKENS}",
    )
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["policy"]["kind"] == "local"
    assert results["policy"]["metadata"]["robot"] == "aloha"
    [episode] = results["episodes"]
    check_episode(episode, steps=20, replan_steps=10)
    assert results["summary"] == {
        "episodes": 1,
        "successes": 0,
        "success_rate": 0.0,
        "mean_max_reward": 0.0,
        "control_hz": episode["control_hz"],
    }
    frames = imageio.mimread(tmp_path / episode["video"])
    assert len(frames) == 20
    assert frames[0].shape == (480, 640, 3)


@pytest.mark.slow  # ~35 s; the local episode covers the loop, test_serve_openpi the ALOHA server
def test_cli_remote_episode_through_the_server(simulator, tmp_path):
    pytest.importorskip("openpi_client.websocket_client_policy")
    from oxygen_jax.policies.policy import create_policy
    from oxygen_jax.serving.policy_backend import PolicyServerBackend
    from oxygen_jax.serving.websocket_server import BackgroundServer

    policy = create_policy("pi05_tiny", None, max_text_tokens=MAX_TEXT_TOKENS, overrides={"robot": "aloha"})
    with BackgroundServer(PolicyServerBackend(policy)) as server:
        run_cli(
            "--policy=remote",
            f"--port={server.port}",
            "--task=AlohaInsertion-v0",
            "--episodes=1",
            "--max_steps=6",
            "--replan_steps=4",
            "--nosave_video",
            f"--out={tmp_path}",
        )
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["policy"]["kind"] == "remote"
    assert results["policy"]["metadata"] == json.loads(json.dumps(policy.metadata))
    assert results["prompt"] == aloha_sim.TASKS["AlohaInsertion-v0"]
    [episode] = results["episodes"]
    check_episode(episode, steps=6, replan_steps=4)
    assert "video" not in episode


def test_remote_without_a_server_is_a_one_line_error(simulator, tmp_path):
    pytest.importorskip("openpi_client.websocket_client_policy")
    stderr = run_cli_failing("--policy=remote", "--port=1", f"--out={tmp_path}")
    assert "error: no policy server at ws://127.0.0.1:1" in stderr


def test_observation_is_the_openpi_aloha_request():
    gym_obs = {
        "pixels": {"top": np.full((480, 640, 3), 200, np.uint8)},
        "agent_pos": np.arange(14, dtype=np.float64),
    }
    obs = aloha_sim.observation(gym_obs, "Transfer cube")
    assert set(obs) == {"images", "state", "prompt"}
    image = obs["images"]["cam_high"]
    assert image.shape == (3, 224, 224) and image.dtype == np.uint8
    # 640x480 -> 224x168 with 28 black rows above and below, as openpi's resize_with_pad.
    assert (image[:, :28] == 0).all() and (image[:, 28:196] == 200).all() and (image[:, 196:] == 0).all()
    np.testing.assert_array_equal(obs["state"], np.arange(14))


def wild_policy() -> StandInPolicy:
    """A stand-in commanding NaN joint positions (what openpi's gripper transform makes of a random model's
    out-of-range gripper actions)."""
    return StandInPolicy(lambda _: np.full((10, 14), np.nan, np.float32))


def test_diverging_physics_ends_the_episode_not_the_evaluation(simulator, tmp_path):
    settings = aloha_sim.Settings(task="AlohaInsertion-v0", episodes=2, max_steps=50, save_video=False)
    results = aloha_sim.evaluate(wild_policy(), settings, tmp_path, {"kind": "local"})
    assert len(results["episodes"]) == 2
    for episode in results["episodes"]:
        assert episode["success"] is False and episode["steps"] < 50
        assert episode["physics_error"].startswith(f"physics diverged at step {episode['steps']}:")
    assert json.loads((tmp_path / "results.json").read_text())["summary"]["episodes"] == 2


def test_chunker_replans_every_replan_steps():
    policy = counting_policy()
    chunker = chunking.ActionChunker(policy, replan_steps=3)
    actions, replans = [], []
    for step in range(7):
        action, replan = chunker.act(step, lambda step=step: {"step": step})
        actions.append(action[0])
        replans.append(replan)
    assert [r["step"] for r in policy.requests] == [0, 3, 6]
    assert actions == [1, 1, 1, 2, 2, 2, 3]
    assert [r.text for r in replans if r is not None] == ["call 1", "call 2", "call 3"]
    chunker.reset()
    chunker.act(7, lambda: {"step": 7})
    assert len(policy.requests) == 4


def test_chunker_refuses_replanning_past_the_horizon():
    with pytest.raises(requirements.SetupError, match="exceeds the policy's action horizon 10"):
        chunking.ActionChunker(counting_policy(), replan_steps=11)


@pytest.fixture(scope="module", params=["aloha_sim", "aloha"])
def tiny_aloha_policy(request):
    """The tiny random-init model, actions only, with openpi's ALOHA sim transforms (absolute joints) or
    pi05_aloha's (joint deltas from the state: rtc's target is re-expressed with each new state)."""
    from oxygen_jax.policies.policy import create_policy

    return create_policy("pi05_tiny", None, max_text_tokens=0, overrides={"robot": request.param})


@pytest.mark.integration  # ~45 s: the tiny model's plain and guided programs compile
def test_executor_modes_run_aloha_and_write_the_closed_loop_fields(simulator, tiny_aloha_policy, tmp_path):
    """Each mode runs a few control steps of ALOHA sim through the executor on the simulated clock and writes
    eval_table's fields. With d = 1 every mode changes chunk at tick 7 while the old chunk still has an
    action for it (first chunk at tick 2, the next asked for after 4 actions), so each measures a jump; on
    the same scene and noise, rtc's guided chunk starts closer to the old one than naive's plain chunk."""
    jumps = {}
    for execution in MODES:
        out = tmp_path / execution
        settings = aloha_sim.Settings(task="AlohaTransferCube-v0", episodes=1, max_steps=9, save_video=False)
        results = aloha_latency.evaluate(
            tiny_aloha_policy,
            settings,
            out,
            {"kind": "local"},
            execution=execution,
            delay_steps=1,
            execution_horizon=6,
        )
        assert json.loads((out / "results.json").read_text()) == json.loads(json.dumps(results))
        assert set(results) >= CLOSED_LOOP_FIELDS
        assert (results["execution"], results["delay_steps"], results["episodes"]) == (execution, 1, 1)
        assert results["action_horizon"] == 10 and results["success_rate"] == 0.0
        [episode] = results["episode_results"]
        assert "physics_error" not in episode and episode["steps"] == 9
        assert results["switches"] == 1 and np.isfinite(results["jerk_mean"])
        jumps[execution] = results["switch_jump_mean"]
    assert 0 < jumps["rtc"] < jumps["naive"]


def test_eval_aloha_refuses_bad_executor_flags_in_one_line(simulator, tmp_path):
    stderr = run_cli_failing("--delay_steps=1", f"--out={tmp_path}")
    assert "error: --delay_steps, --latency_ms and --execution_horizon need --execution" in stderr
    # Checked from the config before the model loads: a delay past the horizon, noise on dims it lacks.
    executor = ("--config=pi05_tiny", "--execution=rtc", f"--out={tmp_path}")
    stderr = run_cli_failing(*executor, "--delay_steps=10")
    assert stderr.strip().splitlines()[-1] == "error: delay_steps must lie in [0, 9], got 10"
    stderr = run_cli_failing(*executor, "--delay_steps=2", "--noise_dims=33")
    assert stderr.strip().splitlines()[-1].startswith("error: noise_dims must lie in [1, 32]")
