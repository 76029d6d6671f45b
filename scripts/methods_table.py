"""docs/rtc.md's "Methods side by side": one row per way of switching chunks (sync, naive, rtc, BID, with one
sample per fresh chunk or 8), one column per latency model and delay, and each method's cost per request,
from the recorded closed-loop runs (benchmarks/results/cpu-2core/methods/run.sh and the closed_loop*/
cells it reuses) and the recorded cost figures. Prints the markdown table; --plot writes a figure:

  python scripts/methods_table.py --plot=benchmarks/results/cpu-2core/methods/methods.png
"""

import json
import pathlib
from typing import Any, NamedTuple

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from absl import app, flags

_RESULTS = flags.DEFINE_string("results", "benchmarks/results", "Folder of the recorded results.")
_PLOT = flags.DEFINE_string("plot", None, "PNG to write (success and switch jump per method and column).")

CPU = "cpu-2core"
MODELS = {"wide": "pi05_detour_wide", "prefix": "pi05_detour_prefix", "moving": "pi05_detour_moving"}
RTC_METHOD = {"wide": "guided", "prefix": "conditioned", "moving": "conditioned"}
# (latency jitter, d): d = H/2 before H/4, the exact delay before the wandering one.
COLUMNS = (("none", 5), ("uniform", 5), ("none", 2), ("uniform", 2))
EXECUTION_HORIZON = 6
NUM_STEPS = 10  # the detour models' denoising steps; BID's weak samples take `bid_weak_steps` of them


class Row(NamedTuple):
    task: str
    model: str  # a key of MODELS
    execution: str  # sync, naive, rtc or bid
    samples: int  # chunks a fresh request draws (bid: every request)


METHODS = (("sync", 1), ("sync", 8), ("naive", 1), ("naive", 8), ("rtc", 1), ("rtc", 8), ("bid", 8))
ROWS = tuple(
    Row("static", model, execution, samples) for model in ("wide", "prefix") for execution, samples in METHODS
)
ROWS += tuple(Row("moving", "moving", execution, samples) for execution, samples in METHODS)
TASKS = ("static", "moving")


def cell_dir(results: pathlib.Path, row: Row, jitter: str, d: int) -> pathlib.Path:
    """The recorded run of a cell: with an exact delay, the 1000-episode runs the closed_loop*/ folders
    already hold; otherwise methods/ (1000 episodes), or methods/e_200/ where that is all there is. The
    moving task's cells are closed_loop_moving/'s (200 episodes; its run.sh)."""
    cpu = results / CPU
    if row.task == "moving":
        uniform = "" if jitter == "none" else f"_{jitter}"
        if row.execution == "bid":
            return cpu / "closed_loop_moving" / f"bid_d{d}{uniform}"
        samples = "" if row.samples == 8 else f"_s{row.samples}"  # 8: the config's, what run.sh ran
        return cpu / "closed_loop_moving" / f"{row.execution}{samples}_d{d}{uniform}"
    if jitter == "none" and row.execution != "bid":
        name = f"{row.execution}_d{d}_e{EXECUTION_HORIZON}"
        if row.model == "prefix":
            return cpu / "closed_loop_prefix" / ("e_1000" if row.samples == 1 else "fresh_samples_8") / name
        if row.samples == 1:
            return cpu / "closed_loop_wide" / "e_1000" / name
    name = f"{row.model}_{row.execution}_s{row.samples}_{jitter}_d{d}"
    full = cpu / "methods" / name
    return full if (full / "results.json").exists() else cpu / "methods" / "e_200" / name


def sync_dir(results: pathlib.Path, row: Row, jitter: str, d: int, episodes: int) -> pathlib.Path:
    """The one-sample sync run a cell's ratios divide by: over the same episodes (a 200-episode cell with an
    exact delay against the first 200 episodes, the closed_loop_*/ sweep's)."""
    sync = Row(row.task, row.model, "sync", 1)
    if episodes == 1000 or row.task == "moving":
        return cell_dir(results, sync, jitter, d)
    if jitter == "none":
        return results / CPU / f"closed_loop_{row.model}" / f"sync_d{d}"
    return results / CPU / "methods" / f"e_{episodes}" / f"{sync.model}_sync_s1_{jitter}_d{d}"


def load(path: pathlib.Path, row: Row, jitter: str, d: int) -> dict[str, Any]:
    """The cell's results.json, checked to be the run the table says it is (older runs did not record
    the config, jitter or samples: their defaults were the table's)."""
    results = json.loads((path / "results.json").read_text())
    expected = {
        "config": (MODELS[row.model], None),
        "execution": (row.execution,),
        "delay_steps": (d,),
        "execution_horizon": (EXECUTION_HORIZON,),
        "seed": (0,),
        "latency_jitter": (jitter, None) if jitter == "none" else (jitter,),
        "fresh_samples": (row.samples, None) if row.samples == 1 else (row.samples,),
    }
    for key, allowed in expected.items():
        if results.get(key) not in allowed:
            raise ValueError(f"{path}: {key} = {results.get(key)}, expected one of {allowed}")
    return results


class Shares(NamedTuple):
    """Milliseconds of one request's phases on a recorded machine."""

    name: str
    prefill_ms: float
    denoise_ms: float


def shares(results: pathlib.Path) -> tuple[Shares, Shares]:
    """Prefill (vision included) and one 10-step denoise at batch 1: `pi05_cpu` on the 2-core CPU
    (roofline.json) and the full-size `pi05` on an H200 (gpu-NVIDIA_H200/summary.json)."""
    cpu = json.loads((results / CPU / "roofline.json").read_text())["phase_ms"]
    gpu = json.loads((results / "gpu-NVIDIA_H200" / "summary.json").read_text())["roofline"]["phase_ms"]
    return (
        Shares("pi05_cpu, CPU", cpu["prefill"], cpu["denoise"]),
        Shares("pi05, H200", gpu["prefill"], gpu["denoise"]),
    )


def denoise_factors(results: pathlib.Path) -> dict[str, float]:
    """A guided and a conditioned denoise against a plain one at batch 1 on `pi05_cpu` (rtc_cost.json,
    rtc_conditioned/rtc_cost.json; neither measured on a GPU)."""
    guided = json.loads((results / CPU / "rtc_cost.json").read_text())["batches"][0]
    conditioned = json.loads((results / CPU / "rtc_conditioned" / "rtc_cost.json").read_text())["batches"][0]
    assert guided["batch"] == conditioned["batch"] == 1
    return {"guided": guided["guided_over_plain"], "conditioned": conditioned["conditioned_over_plain"]}


def denoises(row: Row, factors: dict[str, float], weak_share: float) -> tuple[str, float, float | None]:
    """What a request denoises: its words, its cost in plain batch-1 denoises, and the robot's first
    request's where that differs (rtc draws its samples only there)."""
    if row.execution in ("sync", "naive"):
        return str(row.samples), float(row.samples), None
    if row.execution == "bid":
        return f"{row.samples} + {row.samples} weak", row.samples * (1 + weak_share), None
    method = RTC_METHOD[row.model]
    words = f"1 {method} ({factors[method]:.2f}x)"
    if row.samples == 1:
        return words, factors[method], None
    return f"{words}; the first {row.samples}", factors[method], float(row.samples)


def relative(units: float, machine: Shares) -> float:
    """A request's compute against a plain one-sample request's: one prefill, `units` denoises (N samples
    count N: an upper bound where a batch of N denoises for less than N times one)."""
    plain = machine.prefill_ms + machine.denoise_ms
    return (machine.prefill_ms + units * machine.denoise_ms) / plain


def cell_text(results: dict[str, Any], sync: dict[str, Any]) -> str:
    jump = results["switch_jump_mean"]
    if results["execution"] == "sync" and results.get("fresh_samples") in (1, None):
        jump_text = "none" if jump is None else f"{jump:.3f}"
        steps = "none" if results["mean_steps"] is None else f"{results['mean_steps']:.1f}"
        return f"{results['success_rate']:.3f} / {steps} / {jump_text}"
    if results["mean_steps"] is None or sync["mean_steps"] is None:  # no success to count the steps of
        steps = "none"
    else:
        steps = f"{results['mean_steps'] / sync['mean_steps']:.2f}x"
    jump_text = (
        "none"
        if jump is None or sync["switch_jump_mean"] is None
        else f"{jump / sync['switch_jump_mean']:.2f}x"
    )
    return f"{results['success_rate']:.3f} / {steps} / {jump_text}"


def table(results: pathlib.Path) -> tuple[str, dict[tuple[Row, str, int], dict[str, Any]]]:
    cells = {
        (row, jitter, d): load(cell_dir(results, row, jitter, d), row, jitter, d)
        for row in ROWS
        for jitter, d in COLUMNS
    }
    factors = denoise_factors(results)
    machines = shares(results)
    head = ["task", "model (rtc)", "method", "samples", "denoised per request"]
    head += [f"compute / plain, {m.name}" for m in machines]
    head += [f"d = {d}, {'exact' if jitter == 'none' else 'uniform +-50 %'}" for jitter, d in COLUMNS]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in ROWS:
        bid = cells[(row, "none", 5)].get("bid_weak_steps")
        words, units, first = denoises(row, factors, (bid or 0) / NUM_STEPS)
        compute = []
        for machine in machines:
            text = f"{relative(units, machine):.2f}"
            compute.append(text if first is None else f"{text} (first {relative(first, machine):.2f})")
        texts = []
        for jitter, d in COLUMNS:
            result = cells[(row, jitter, d)]
            sync_row = Row(row.task, row.model, "sync", 1)
            sync = load(sync_dir(results, row, jitter, d, result["episodes"]), sync_row, jitter, d)
            if sync["episodes"] != result["episodes"]:
                raise ValueError(f"{row} {jitter} {d}: no sync run over its {result['episodes']} episodes")
            marker = "" if result["episodes"] == 1000 else f" ({result['episodes']} ep.)"
            texts.append(cell_text(result, sync) + marker)
        name = f"`{MODELS[row.model]}` ({RTC_METHOD[row.model]})"
        method = row.execution if row.execution != "rtc" else f"rtc, {RTC_METHOD[row.model]}"
        lines.append(
            "| " + " | ".join([row.task, name, method, str(row.samples), words, *compute, *texts]) + " |"
        )
    return "\n".join(lines), cells


def plot(cells: dict[tuple[Row, str, int], dict[str, Any]], path: pathlib.Path) -> None:
    """Success and mean switch jump per method, a pair of rows per task (the static task's success is
    drawn from 0.8, where its methods differ; the moving task's from 0)."""
    figure, axes = plt.subplots(2 * len(TASKS), len(COLUMNS), figsize=(5 * len(COLUMNS), 7 * len(TASKS)))
    colours = {"sync": "tab:blue", "naive": "tab:orange", "rtc": "tab:green", "bid": "tab:purple"}
    for index, task in enumerate(TASKS):
        rows = [r for r in ROWS if r.task == task]
        labels = [f"{r.model} {r.execution} x{r.samples}" for r in rows]
        colour = [colours[r.execution] for r in rows]
        for column, (jitter, d) in enumerate(COLUMNS):
            success_axis, jump_axis = axes[2 * index, column], axes[2 * index + 1, column]
            success_axis.barh(labels, [cells[(r, jitter, d)]["success_rate"] for r in rows], color=colour)
            success_axis.set_xlim(0.8 if task == "static" else 0.0, 1.0)
            success_axis.set_title(
                f"{task} task, d = {d}, {'exact' if jitter == 'none' else 'uniform +-50 %'}"
            )
            success_axis.set_xlabel("success")
            jumps = [cells[(r, jitter, d)]["switch_jump_mean"] or 0.0 for r in rows]
            jump_axis.barh(labels, jumps, color=colour)
            jump_axis.set_xlabel("mean switch jump (table units)")
    for axis in axes.flat:
        axis.invert_yaxis()
        axis.tick_params(axis="y", labelsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main(_) -> None:
    results = pathlib.Path(_RESULTS.value)
    text, cells = table(results)
    print(text)
    if _PLOT.value:
        plot(cells, pathlib.Path(_PLOT.value))


if __name__ == "__main__":
    app.run(main)
