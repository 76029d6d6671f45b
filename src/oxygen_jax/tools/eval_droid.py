"""DROID evaluation: drive a real DROID robot from a policy server, or replay recorded observations.

On the robot's control computer (with the DROID robot stack installed), against oxygen-serve:
  oxygen-eval-droid --mode=robot --policy=remote --host=SERVER --port=8000 \
      --left_camera_id=24259877 --right_camera_id=24514023 --wrist_camera_id=13062452 --external_camera=left
Each rollout asks for an instruction, runs at 15 Hz until --max_steps or Ctrl+C, then asks for a score;
scores go to --out/droid_eval_<time>.csv.

Offline, through a local or served policy (a folder of npz observations, or a synthetic stream):
  oxygen-eval-droid --mode=replay --replay_dir=FRAMES --config=pi05_droid --checkpoint_dir=CKPT
  oxygen-eval-droid --mode=replay --synthetic_frames=32 --config=pi05_tiny --out=DIR

Default config: pi05_droid, the robot's (docs/cli.md).
"""

import pathlib

from absl import flags

from oxygen_jax.evaluation import droid, policies, recording, video
from oxygen_jax.tools import cli

_POLICY = cli.define_policy_flags("pi05_droid")
_MODE = flags.DEFINE_enum("mode", "replay", ["robot", "replay"], "Real robot, or offline replay.")
_MAX_STEPS = flags.DEFINE_integer("max_steps", 600, "Control steps per rollout (15 Hz).", lower_bound=1)
_REPLAN = flags.DEFINE_integer(
    "replan_steps", 8, "Actions executed from each chunk before replanning.", lower_bound=1
)
_VIDEO = flags.DEFINE_bool("save_video", True, "Write a video of the exterior camera per rollout.")
_OUT = cli.define_out_flag("eval_results/droid", "Folder for results, CSV and videos.")
# Robot.
_LEFT = flags.DEFINE_string("left_camera_id", None, "Left exterior ZED camera id.")
_RIGHT = flags.DEFINE_string("right_camera_id", None, "Right exterior ZED camera id.")
_WRIST = flags.DEFINE_string("wrist_camera_id", None, "Wrist ZED camera id.")
_EXTERNAL = flags.DEFINE_enum("external_camera", None, ["left", "right"], "Exterior camera the policy sees.")
# Replay.
_REPLAY_DIR = flags.DEFINE_string("replay_dir", None, "Folder of npz observations (openpi DROID keys).")
_SYNTHETIC = flags.DEFINE_integer(
    "synthetic_frames", 32, "Synthetic frames when --replay_dir is absent.", lower_bound=1
)
_PROMPT = flags.DEFINE_string("prompt", "pick up the marker", "Replay prompt (a frame's own `prompt` wins).")
_REALTIME = flags.DEFINE_bool("realtime", True, "Replay at 15 Hz (else as fast as the policy answers).")
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the synthetic stream.")


def _robot(settings: droid.Settings, out_dir: pathlib.Path) -> None:
    if not (_LEFT.value and _RIGHT.value and _WRIST.value and _EXTERNAL.value):
        cli.fail(
            "--mode=robot needs --left_camera_id, --right_camera_id, --wrist_camera_id, --external_camera"
        )
    cameras = droid.Cameras(_LEFT.value, _RIGHT.value, _WRIST.value, _EXTERNAL.value)
    env = droid.load_robot_env()
    policy = policies.policy_for("droid", **_POLICY.settings())
    recorder = recording.recorder_for(_POLICY.record_dir.value, droid.CONTROL_HZ, "droid")
    csv_path = droid.run_robot(policy, env, cameras, droid.ConsoleOperator(), settings, out_dir, recorder)
    print(f"wrote {csv_path}")


def _replay(settings: droid.Settings, out_dir: pathlib.Path) -> None:
    if _REPLAY_DIR.value:
        frames = droid.load_frames(pathlib.Path(_REPLAY_DIR.value))
    else:
        frames = droid.synthetic_frames(_SYNTHETIC.value, _SEED.value)
    recorder = recording.recorder_for(_POLICY.record_dir.value, droid.CONTROL_HZ, "droid")
    results = droid.replay(
        policies.policy_for("droid", **_POLICY.settings()),
        frames,
        _PROMPT.value,
        settings,
        out_dir,
        _POLICY.description(),
        recorder,
    )
    r = results["rollout"]
    median = (r["infer_ms"] or {}).get("median")
    late = "" if r["late_steps"] is None else f", {r['late_steps']} steps late for 15 Hz"
    print(
        f"replayed {r['steps']} steps, {r['replans']} policy calls (median {median} ms), "
        f"control {r['control_hz']:.1f} Hz{late}"
    )
    for entry in r["texts"]:
        print(f"  step {entry['step']}: {entry['text']!r}")
    print(f"wrote {out_dir / 'results.json'} and {out_dir / 'actions.npz'}")


def main(_):
    realtime = _REALTIME.value or _MODE.value == "robot"
    settings = droid.Settings(
        max_steps=_MAX_STEPS.value,
        open_loop_horizon=_REPLAN.value,
        control_hz=droid.CONTROL_HZ if realtime else None,
        save_video=_VIDEO.value,
    )
    if settings.save_video:  # written at the end of the run: a missing writer is reported first
        video.video_writer(install="pip install 'oxygen_jax[droid]' (or pass --nosave_video)")
    _POLICY.preflight(_OUT.value)
    out_dir = pathlib.Path(_OUT.value)
    if _MODE.value == "robot":
        _robot(settings, out_dir)
    else:
        _replay(settings, out_dir)


def run() -> None:
    """The `oxygen-eval-droid` command."""
    cli.run(main)


if __name__ == "__main__":
    run()
