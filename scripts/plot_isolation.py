"""Plot the healthy robot's replies through an attack probe: latency over time, each attack's window shaded.

  python scripts/plot_isolation.py benchmarks/results/cpu-2core/isolation.json  # isolation.png beside it

Reads the `healthy_timeline` and `attack_windows` that `probe_isolation.py --out=DIR` records; the lines
mark the robot's median alone (its replies before the first attack) and twice it, the bound the issue
sets for attacks whose requests are refused. The stall and bound attacks (rows of `stall_table`) are
labelled; the malformed requests before them are one grey band.
"""

import json
import pathlib
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np


def plot(record: dict, path: pathlib.Path) -> None:
    timeline = np.asarray(record["healthy_timeline"])
    windows = record["attack_windows"]
    labelled = {row["attack"] for row in record["stall_table"]}
    first = min(start for start, _ in windows.values())
    median = float(np.median(timeline[timeline[:, 0] < first, 1]))
    fig, ax = plt.subplots(figsize=(14, 5))
    for index, (name, (start, end)) in enumerate(windows.items()):
        if name in labelled:
            ax.axvspan(start, end, color=f"C{index % 10}", alpha=0.18)
            ax.text(start, 0.98, name, rotation=90, va="top", fontsize=7, transform=ax.get_xaxis_transform())
        else:
            ax.axvspan(start, end, color="0.85", alpha=0.6, lw=0)
    ax.scatter(timeline[:, 0], timeline[:, 1], s=4, color="k", label="healthy robot's replies")
    ax.axhline(median, color="C2", lw=1, label=f"median alone ({median:.1f} ms)")
    ax.axhline(2 * median, color="C3", lw=1, ls="--", label="2x the median alone")
    ax.set_yscale("log")
    ax.set_xlabel("seconds since the healthy robot's first reply")
    ax.set_ylabel("reply latency, ms")
    ax.set_title(record.get("command", "probe_isolation.py"), fontsize=8)
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str]) -> None:
    if len(argv) != 2:
        sys.exit(__doc__)
    source = pathlib.Path(argv[1])
    record = json.loads(source.read_text())
    if "healthy_timeline" not in record:
        sys.exit(f"{source} has no healthy_timeline: record it again with probe_isolation.py --out")
    out = source.with_suffix(".png")
    plot(record, out)
    print(f"wrote {out}")


if __name__ == "__main__":
    main(sys.argv)
