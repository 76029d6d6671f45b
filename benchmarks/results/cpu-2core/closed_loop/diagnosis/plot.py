"""The diagnosis's trade-off: success against mean switch jump for every rtc setting at d = 3 and 5, with
naive and sync at the same d (from the recorded sweep), written next to this file as tradeoff.png.

  python benchmarks/results/cpu-2core/closed_loop/diagnosis/plot.py
"""

import json
import pathlib

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

HERE = pathlib.Path(__file__).resolve().parent


def _point(path: pathlib.Path) -> tuple[float, float]:
    results = json.loads((path / "results.json").read_text())
    return results["switch_jump_mean"], results["success_rate"]


def main() -> None:
    figure, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for axis, d in zip(axes, (3, 5), strict=True):
        # The 1000-episode runs are the table in docs/rtc.md, not settings of this plot.
        for name in sorted(p.name for p in HERE.glob(f"rtc_d{d}_*") if not p.name.endswith("_1000")):
            jump, success = _point(HERE / name)
            axis.plot(jump, success, "o", color="tab:green")
            axis.annotate(
                name.removeprefix(f"rtc_d{d}_"),
                (jump, success),
                fontsize=8,
                xytext=(3, 3),
                textcoords="offset points",
            )
        for mode, colour in (("rtc", "tab:green"), ("naive", "tab:orange"), ("sync", "tab:blue")):
            jump, success = _point(HERE.parent / f"{mode}_d{d}")
            axis.plot(jump, success, "s", color=colour, markersize=9, label=f"{mode} (sweep)")
        axis.set_title(f"d = {d}: rtc settings (default exp, beta 5, s = actions left)")
        axis.set_xlabel("mean switch jump (table units)")
        axis.grid(alpha=0.3)
    axes[0].set_ylabel("success rate")
    axes[1].legend(loc="upper right")
    figure.suptitle(
        "detour task, 200 episodes per point: holding the old chunk more trades success for jumps"
    )
    figure.tight_layout()
    figure.savefig(HERE / "tradeoff.png", dpi=110)


if __name__ == "__main__":
    main()
