"""The closed-loop sweep: every execution mode at every delay d on the same held-out scenes, its
results.json per run, one summary and a plot of success, control steps and switch jumps against d."""

import json
import pathlib
from collections.abc import Sequence
from typing import Any

from oxygen_jax import plotting
from oxygen_jax.client import MODES
from oxygen_jax.evaluation import closed_loop
from oxygen_jax.policies.policy import Policy
from oxygen_jax.robots import trial

_PANELS = (
    ("success_rate", "success rate"),
    ("mean_steps", "control steps to success"),
    ("switch_jump_mean", "mean switch jump (table units)"),
)


def run_dir(out: pathlib.Path, execution: str, delay_steps: int) -> pathlib.Path:
    return out / f"{execution}_d{delay_steps}"


def write_results(results: dict[str, Any], out: pathlib.Path) -> pathlib.Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / "results.json"
    path.write_text(json.dumps(results, indent=2) + "\n")
    return path


def sweep(
    policy: Policy,
    out: pathlib.Path,
    *,
    delays: Sequence[int],
    episodes: int,
    seed: int,
    execution_horizon: int,
    modes: Sequence[str] = MODES,
    guidance: trial.GuidanceSettings = trial.DEFAULT_GUIDANCE,
) -> list[dict[str, Any]]:
    """Runs every (mode, d), writing OUT/<mode>_d<d>/results.json, OUT/sweep.json and OUT/closed_loop.png."""
    rows = []
    for execution in modes:
        for delay in delays:
            results = closed_loop.evaluate(
                policy,
                execution=execution,
                delay_steps=delay,
                episodes=episodes,
                seed=seed,
                execution_horizon=execution_horizon,
                guidance=guidance,
            )
            write_results(results, run_dir(out, execution, delay))
            rows.append(results)
    (out / "sweep.json").write_text(json.dumps(rows, indent=2) + "\n")
    plot(rows, out / "closed_loop.png")
    return rows


def plot(rows: Sequence[dict[str, Any]], path: pathlib.Path) -> None:
    """One panel per figure, one line per mode, d on the x axis."""
    plt = plotting.pyplot()
    figure, axes = plt.subplots(1, len(_PANELS), figsize=(4.2 * len(_PANELS), 3.4))
    for axis, (key, label) in zip(axes, _PANELS, strict=True):
        for execution in dict.fromkeys(row["execution"] for row in rows):
            points = [
                (r["delay_steps"], r[key]) for r in rows if r["execution"] == execution and r[key] is not None
            ]
            axis.plot(*zip(*points, strict=True), marker="o", label=execution)
        axis.set_xlabel("delay d (control steps)")
        axis.set_title(label)
        axis.grid(alpha=0.3)
    axes[0].legend()
    first = rows[0]
    noise = "" if first.get("noise_dims") is None else f", noise on the first {first['noise_dims']} dims"
    figure.suptitle(
        f"{first['config']} on the detour task, closed loop: H={first['action_horizon']}, execution horizon "
        f"{first['execution_horizon']}, {first['episodes']} episodes per point{noise}"
    )
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
