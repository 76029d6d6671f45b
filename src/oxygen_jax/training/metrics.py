"""Training metrics: one JSON line per logged step, and a plot of the loss terms over steps."""

import json
import os
import pathlib
from collections.abc import Mapping

from oxygen_jax import plotting

PLOTTED = ("loss", "loss_flow", "loss_ce")


def append_metrics(path: str | os.PathLike[str], step: int, metrics: Mapping[str, float]) -> None:
    """Appends `{"step": step, **metrics}`; a resumed run keeps writing the same file."""
    with open(path, "a") as f:
        f.write(json.dumps({"step": step, **{k: float(v) for k, v in metrics.items()}}) + "\n")


def read_metrics(path: str | os.PathLike[str]) -> list[dict[str, float]]:
    """Logged rows by step; a step logged twice (a resumed run redoing it) keeps its last row."""
    rows = {}
    for line in pathlib.Path(path).read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            rows[row["step"]] = row
    return [rows[step] for step in sorted(rows)]


def plot_losses(metrics_path: str | os.PathLike[str], out_path: str | os.PathLike[str]) -> pathlib.Path:
    """PNG of loss, loss_flow and loss_ce against the step (log scale over more than a decade)."""
    rows = read_metrics(metrics_path)
    steps = [row["step"] for row in rows]
    series = {name: [row.get(name, 0.0) for row in rows] for name in PLOTTED}
    series = {name: values for name, values in series.items() if any(values)}  # loss_ce is 0 without text
    fig, ax = plotting.pyplot().subplots(figsize=(7, 4))
    for name, values in series.items():
        ax.plot(steps, values, label=name, marker="." if len(rows) < 50 else None)
    values = [v for vs in series.values() for v in vs]
    if values and min(values) > 0 and max(values) > 10 * min(values):
        ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (batch mean)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    out_path = pathlib.Path(out_path)
    fig.savefig(out_path, dpi=100)
    plotting.pyplot().close(fig)
    return out_path
