"""Success against the step budget on the moving detour task: each method's success rate had every episode
been given B control steps, for every B up to the runs' budget, from one set of runs
(benchmarks/results/cpu-2core/closed_loop_moving_budget/run.sh, 120 steps).

  python scripts/plot_success_budget.py \
    --plot=benchmarks/results/cpu-2core/closed_loop_moving_budget/budget.png

An episode stops at success or collision and nothing else depends on the budget, so a run to 120 steps
holds the task's 42-step run cut short (`closed_loop.success_within`). Prints a markdown table (success at
--budgets, collisions, and the budgets at which rtc succeeds less often than naive or sync); --plot
draws one panel per delay and latency model, the task's budget marked.
"""

import json
import pathlib
from typing import Any

from absl import app, flags

from oxygen_jax.evaluation import closed_loop
from oxygen_jax.plotting import pyplot
from oxygen_jax.table_task import moving_detour

_RESULTS = flags.DEFINE_string(
    "results",
    "benchmarks/results/cpu-2core/closed_loop_moving_budget",
    "Folder of the runs (run.sh's cells).",
)
_BUDGETS = flags.DEFINE_list("budgets", ["42", "60", "80", "120"], "Budgets the table shows.")
_PLOT = flags.DEFINE_string("plot", None, "PNG to write.")

METHODS = ("sync", "naive", "rtc")
PANELS = (("none", 5), ("uniform", 5), ("none", 2), ("uniform", 2))  # (latency jitter, d)


def cell_name(execution: str, jitter: str, d: int) -> str:
    return f"{execution}_d{d}" + ("" if jitter == "none" else f"_{jitter}")


def load(results: pathlib.Path) -> dict[tuple[str, str, int], dict[str, Any]]:
    """{(execution, jitter, d): results.json} for every cell; SystemExit naming the first one missing."""
    cells = {}
    for jitter, d in PANELS:
        for execution in METHODS:
            path = results / cell_name(execution, jitter, d) / "results.json"
            if not path.is_file():
                raise SystemExit(f"error: {path} is missing (run {results}/run.sh)")
            cells[(execution, jitter, d)] = json.loads(path.read_text())
    return cells


def curve(cell: dict[str, Any]) -> list[float]:
    """Success within B steps for B = 0 .. the run's max_steps."""
    return [closed_loop.success_within(cell, budget) for budget in range(cell["max_steps"] + 1)]


def behind_at(rtc: list[float], other: list[float]) -> str:
    """The budgets at which rtc succeeds less often than `other`, as ranges ("none" if none)."""
    ranges: list[list[int]] = []
    for budget, (mine, theirs) in enumerate(zip(rtc, other, strict=True)):
        if mine < theirs:
            if ranges and ranges[-1][1] == budget - 1:
                ranges[-1][1] = budget
            else:
                ranges.append([budget, budget])
    return ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in ranges) or "none"


def table(cells: dict[tuple[str, str, int], dict[str, Any]], budgets: list[int]) -> str:
    head = ["delay", "d", "method", *(f"success in {b}" for b in budgets), "collisions", "rtc behind it at"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for jitter, d in PANELS:
        curves = {m: curve(cells[(m, jitter, d)]) for m in METHODS}
        for execution in METHODS:
            cell = cells[(execution, jitter, d)]
            behind = "" if execution == "rtc" else behind_at(curves["rtc"], curves[execution])
            row = [
                "exact" if jitter == "none" else "uniform +-50 %",
                str(d),
                execution,
                *(f"{closed_loop.success_within(cell, b):.3f}" for b in budgets),
                f"{cell['collision_rate']:.3f}",
                behind,
            ]
            lines.append("| " + " | ".join(row) + " |")
    episodes = {cell["episodes"] for cell in cells.values()}
    return "\n".join(lines) + f"\n\n({', '.join(map(str, sorted(episodes)))} episodes per cell)"


def plot(cells: dict[tuple[str, str, int], dict[str, Any]], path: pathlib.Path) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(2, 2, figsize=(11, 7), sharex=True, sharey=True)
    for ax, (jitter, d) in zip(axes.flat, PANELS, strict=True):
        for index, execution in enumerate(METHODS):
            values = curve(cells[(execution, jitter, d)])
            ax.step(range(len(values)), values, where="post", color=f"C{index}", label=execution)
        ax.axvline(moving_detour.MAX_STEPS, color="0.5", ls="--", lw=1)
        ax.text(moving_detour.MAX_STEPS + 1, 0.03, "the task's budget", color="0.4", fontsize=8)
        ax.set_title(f"d = {d}, {'exact' if jitter == 'none' else 'uniform +-50 %'} delay", fontsize=10)
        ax.grid(alpha=0.3)
    for ax in axes[1]:
        ax.set_xlabel("step budget B (control steps per episode)")
    for ax in axes[:, 0]:
        ax.set_ylabel("success within B steps")
    axes[0, 0].legend(loc="upper left")
    fig.suptitle("pi05_detour_moving, the tools' defaults: success against the step budget", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(_) -> None:
    cells = load(pathlib.Path(_RESULTS.value))
    print(table(cells, [int(b) for b in _BUDGETS.value]))
    if _PLOT.value:
        plot(cells, pathlib.Path(_PLOT.value))
        print(f"wrote {_PLOT.value}")


if __name__ == "__main__":
    app.run(main)
