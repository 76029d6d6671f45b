"""The detour diagnosis's trade-off: success against mean switch jump for every rtc setting at d = 3 and 5,
with naive and sync at the same d (from the recorded sweep in the runs' parent folder; 200 episodes,
E = 6), and at d = 2 and 3 with E = 5 (1000 episodes), from the runs that
benchmarks/results/cpu-2core/closed_loop/diagnosis/run.sh records; writes RUNS/tradeoff.png:

  python scripts/plot_detour_tradeoff.py --runs=benchmarks/results/cpu-2core/closed_loop/diagnosis
"""

import json
import pathlib

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from absl import app, flags

_RUNS = flags.DEFINE_string(
    "runs", "benchmarks/results/cpu-2core/closed_loop/diagnosis", "Folder of the diagnosis runs."
)
_OUT = flags.DEFINE_string("out", None, "PNG to write (default: RUNS/tradeoff.png).")


def _point(path: pathlib.Path) -> tuple[float, float]:
    results = json.loads((path / "results.json").read_text())
    return results["switch_jump_mean"], results["success_rate"]


MODES = (("rtc", "tab:green"), ("naive", "tab:orange"), ("sync", "tab:blue"))


def _settings(axis, runs: pathlib.Path, names: list[str], prefix: str, suffix: str) -> None:
    for name in names:
        jump, success = _point(runs / name)
        axis.plot(jump, success, "o", color="tab:green")
        axis.annotate(
            name.removeprefix(prefix).removesuffix(suffix),
            (jump, success),
            fontsize=8,
            xytext=(3, 3),
            textcoords="offset points",
        )


def main(_) -> None:
    runs = pathlib.Path(_RUNS.value)
    figure, axes = plt.subplots(1, 4, figsize=(20, 4.2))
    for axis, d in zip(axes[:2], (3, 5), strict=True):
        # Settings at E = 6 (200 episodes); the 1000-episode runs are the other panels and docs/rtc.md.
        names = sorted(p.name for p in runs.glob(f"rtc_d{d}_*") if not p.name.endswith("_1000"))
        _settings(axis, runs, names, f"rtc_d{d}_", "")
        for mode, colour in MODES:
            jump, success = _point(runs.parent / f"{mode}_d{d}")
            axis.plot(jump, success, "s", color=colour, markersize=9, label=f"{mode} (sweep)")
        axis.set_title(f"d = {d}, E = 6, 200 episodes (default exp, beta 5)", fontsize=10)
    for axis, d in zip(axes[2:], (2, 3), strict=True):
        suffix = f"_d{d}_e5_1000"
        _settings(
            axis,
            runs,
            sorted(p.name for p in runs.glob(f"rtc_*{suffix}") if p.name != f"rtc{suffix}"),
            "rtc_",
            suffix,
        )
        for mode, colour in MODES:
            jump, success = _point(runs / f"{mode}{suffix}")
            axis.plot(
                jump,
                success,
                "s",
                color=colour,
                markersize=9,
                label=f"{mode} (exp, beta 5)" if mode == "rtc" else mode,
            )
        axis.axvline(
            1.2 * _point(runs / f"sync{suffix}")[0], color="grey", linestyle=":", label="1.2x sync's jump"
        )
        axis.set_title(f"d = {d}, E = 5, 1000 episodes", fontsize=10)
    for axis in axes:
        axis.set_xlabel("mean switch jump (table units)")
        axis.grid(alpha=0.3)
    axes[0].set_ylabel("success rate")
    axes[1].legend(loc="upper right")
    axes[3].legend(loc="lower right")
    figure.suptitle(
        "detour task: holding the old chunk harder (schedule, beta) trades success for smaller jumps"
    )
    figure.tight_layout()
    figure.savefig(_OUT.value or runs / "tradeoff.png", dpi=110)


if __name__ == "__main__":
    app.run(main)
