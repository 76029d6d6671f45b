"""Draws the frame timeline of isolated vs oxygen from recorded benchmark runs (docs/img/frame_timeline.png).

  python scripts/plot_frame_timeline.py --runs=benchmarks/results/cpu-2core/runs

Each row repeats one mode's mean frame: the action path (prefill + denoise, ends when the chunk is emitted)
then the language work that mode does in the frame (isolated: a second prefill and the whole answer;
shared_kv: the whole answer from the same prefix; oxygen: k decode steps for every active request).
"""

import json
import pathlib

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from absl import app, flags

_RUNS = flags.DEFINE_string("runs", "benchmarks/results/cpu-2core/runs", "Folder of benchmark run JSONs.")
_OUT = flags.DEFINE_string("out", "docs/img/frame_timeline.png", "PNG to write.")
_SWEEP = flags.DEFINE_string("sweep", "ablation", "Which sweep's runs to draw.")
_WINDOW_S = flags.DEFINE_float("window_s", 2.0, "Seconds of wall time to draw.")

MODES = ("isolated", "shared_kv", "oxygen")


def _runs(folder: pathlib.Path, sweep: str) -> dict[str, dict]:
    runs = {}
    for path in sorted(folder.glob("*.json")):
        run = json.loads(path.read_text())
        spec = run.get("spec", {})
        if spec.get("sweep") == sweep and spec.get("mode") in MODES and spec.get("target_hz") is None:
            runs[spec["mode"]] = run
    missing = [m for m in MODES if m not in runs]
    if missing:
        raise SystemExit(f"no {sweep} runs for {missing} in {folder}")
    return runs


def main(_):
    runs = _runs(pathlib.Path(_RUNS.value), _SWEEP.value)
    fig, ax = plt.subplots(figsize=(11, 2.8))
    for row, mode in enumerate(MODES):
        run = runs[mode]
        action, frame = run["action_ms_mean"] / 1e3, run["frame_ms_mean"] / 1e3
        t, frames = 0.0, 0
        while t < _WINDOW_S.value:
            ax.broken_barh([(t, action)], (row - 0.35, 0.7), color="tab:blue")
            ax.broken_barh([(t + action, frame - action)], (row - 0.35, 0.7), color="tab:orange")
            ax.plot([t + action], [row + 0.45], marker="v", color="black", markersize=5)
            t, frames = t + frame, frames + 1
        label = f"{mode}: {run['action_hz']:.1f} Hz, {run['tokens_per_s']:.0f} tok/s"
        ax.text(_WINDOW_S.value * 1.01, row, label, va="center", fontsize=9)
    ax.set_yticks(range(len(MODES)), MODES)
    ax.set_xlim(0, _WINDOW_S.value)
    ax.set_ylim(-0.6, len(MODES) - 0.3)
    ax.invert_yaxis()
    ax.set_xlabel("wall time (s)")
    spec = runs["oxygen"]["spec"]
    ax.set_title(
        f"{runs['oxygen']['config']} ({runs['oxygen']['device_kind']}), {spec.get('layout')}, "
        f"N={spec.get('max_new')}, k={spec.get('k')}: blue = action path (▼ chunk emitted), "
        "orange = language in the frame",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(_OUT.value, dpi=120, bbox_inches="tight")
    print(f"wrote {_OUT.value}")


if __name__ == "__main__":
    app.run(main)
