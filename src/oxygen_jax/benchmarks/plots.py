"""Plots of the run records: each is drawn only when the sweeps it needs are among the results."""

import pathlib

from oxygen_jax import plotting
from oxygen_jax.benchmarks.report import ablation, label

ABLATION_ORDER = ("isolated", "parallel", "shared_kv", "oxygen", "oxygen_deadline", "batching upper bound")


def _select(runs: list[dict], sweep: str, mode: str) -> list[dict]:
    return [r for r in runs if r["spec"]["sweep"] == sweep and label(r) == mode]


def _save(fig, path: pathlib.Path) -> pathlib.Path:
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plotting.pyplot().close(fig)
    return path


def speedup_vs_n_k(runs: list[dict], out: pathlib.Path) -> pathlib.Path | None:
    """Oxygen's action-rate speedup over isolated at the same N, one line per k."""
    iso = {r["spec"]["max_new"]: r["action_hz"] for r in _select(runs, "n_k", "isolated")}
    oxy = [r for r in _select(runs, "n_k", "oxygen") if r["spec"]["max_new"] in iso]
    if not oxy:
        return None
    fig, ax = plotting.pyplot().subplots(figsize=(5, 3.5))
    for k in sorted({r["spec"]["k"] for r in oxy}):
        points = sorted(
            (r["spec"]["max_new"], r["action_hz"] / iso[r["spec"]["max_new"]])
            for r in oxy
            if r["spec"]["k"] == k
        )
        ax.plot(*zip(*points, strict=True), marker="o", label=f"k={k}")
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.set(
        xlabel="N (max new tokens)", ylabel="speedup over isolated (action Hz)", title="OxyGen vs isolated"
    )
    ax.legend()
    return _save(fig, out / "speedup_vs_n_k.png")


def ablation_bars(runs: list[dict], roof: dict, out: pathlib.Path) -> pathlib.Path | None:
    """Action Hz, tokens/s and peak memory per mode at the ablation point, with the cost model's
    perfect-batching bound and the action-only floor as a line."""
    modes = ablation(runs)
    if not modes:
        return None
    cost = roof["cost_model"]
    hz = {name: r["action_hz"] for name, r in modes.items()}
    tok = {name: r["tokens_per_s"] for name, r in modes.items()}
    hz["batching upper bound"] = 1e3 / cost["batching_upper_bound_frame_ms"]
    spec = next(iter(modes.values()))["spec"]
    tok["batching upper bound"] = hz["batching upper bound"] * spec["rate"] * spec["max_new"]
    names = [n for n in ABLATION_ORDER if n in hz]
    fig, axes = plotting.pyplot().subplots(1, 3, figsize=(13, 3.8))
    for ax, values, title in ((axes[0], hz, "action Hz"), (axes[1], tok, "tokens/s")):
        ax.bar(names, [values[n] for n in names], color="tab:blue")
        ax.set_title(title)
        ax.tick_params(axis="x", rotation=35)
    if "action_only" in hz:
        axes[0].axhline(hz["action_only"], color="tab:red", ls="--", label="action only")
        axes[0].legend()
    mem_names = [n for n in (*ABLATION_ORDER, "action_only") if n in modes]
    axes[2].bar(mem_names, [modes[n]["peak_memory_bytes"] / 2**20 for n in mem_names], color="tab:gray")
    axes[2].set_title("peak memory (MiB)")
    axes[2].tick_params(axis="x", rotation=35)
    return _save(fig, out / "ablation.png")


def workloads(runs: list[dict], out: pathlib.Path) -> pathlib.Path | None:
    """Action Hz (top) and tokens/s (bottom) of isolated and oxygen across the arrival workloads."""
    panels = [
        ("uniform", "rate", "requests per frame"),
        ("poisson", "rate", "Poisson lambda"),
        ("random_length", "long_fraction", "fraction of long (20-token) requests"),
    ]
    panels = [p for p in panels if _select(runs, p[0], "oxygen")]
    if not panels:
        return None
    fig, axes = plotting.pyplot().subplots(2, len(panels), figsize=(4.5 * len(panels), 6), squeeze=False)
    for col, (sweep, key, xlabel) in enumerate(panels):
        for mode in ("isolated", "oxygen"):
            points = sorted(
                (r["spec"][key], r["action_hz"], r["tokens_per_s"]) for r in _select(runs, sweep, mode)
            )
            if not points:
                continue
            x, hz, tok = zip(*points, strict=True)
            axes[0][col].plot(x, hz, marker="o", label=mode)
            axes[1][col].plot(x, tok, marker="o", label=mode)
        axes[0][col].set(title=sweep, ylabel="action Hz")
        axes[1][col].set(xlabel=xlabel, ylabel="tokens/s")
        axes[0][col].legend()
    return _save(fig, out / "workloads.png")


def tradeoff(runs: list[dict], out: pathlib.Path) -> pathlib.Path | None:
    """Action Hz vs tokens/s at the ablation point: the baselines, fixed k (n_k sweep at N=30) and
    deadline-aware k (deadline sweep)."""
    points = {}
    for r in runs:
        s = r["spec"]
        if s["sweep"] in ("ablation", "deadline") or (s["sweep"] == "n_k" and s["max_new"] == 30):
            points.setdefault((label(r), s["k"] if s["mode"] == "oxygen" else 0, s["target_hz"]), r)
    if len(points) < 2:
        return None
    fig, ax = plotting.pyplot().subplots(figsize=(5.5, 4))
    for (name, k, target), r in points.items():
        text = name + (f" {target:g} Hz" if target else f" k={k}" if k else "")
        ax.scatter(
            r["action_hz"], r["tokens_per_s"], color="tab:green" if name.startswith("oxygen") else "tab:gray"
        )
        ax.annotate(
            text, (r["action_hz"], r["tokens_per_s"]), fontsize=7, xytext=(3, 3), textcoords="offset points"
        )
    ax.set(xlabel="action Hz", ylabel="tokens/s", title="Action rate vs language throughput (N=30)")
    return _save(fig, out / "tradeoff.png")


def steps(runs: list[dict], out: pathlib.Path) -> pathlib.Path | None:
    """Action Hz of the core modes against the number of denoising steps S."""
    if not _select(runs, "steps", "oxygen"):
        return None
    fig, ax = plotting.pyplot().subplots(figsize=(5, 3.5))
    for mode in ("isolated", "oxygen", "action_only"):
        points = sorted((r["spec"]["num_steps"], r["action_hz"]) for r in _select(runs, "steps", mode))
        if points:
            ax.plot(*zip(*points, strict=True), marker="o", label=mode)
    ax.set(xlabel="denoising steps S", ylabel="action Hz", title="Denoising steps")
    ax.legend()
    return _save(fig, out / "steps.png")


def camera_skip(runs: list[dict], out: pathlib.Path) -> pathlib.Path | None:
    """LIBERO action Hz with the masked camera slot computed (off) or skipped (on)."""
    modes = ablation(runs)
    pairs = [
        (m, modes[m], _select(runs, "skip", m + "_noskip")) for m in ("action_only", "oxygen") if m in modes
    ]
    pairs = [(m, on, off[0]) for m, on, off in pairs if off]
    if not pairs:
        return None
    fig, ax = plotting.pyplot().subplots(figsize=(5, 3.5))
    x = range(len(pairs))
    ax.bar([i - 0.2 for i in x], [off["action_hz"] for _, _, off in pairs], 0.4, label="skip off")
    ax.bar([i + 0.2 for i in x], [on["action_hz"] for _, on, _ in pairs], 0.4, label="skip on")
    ax.set_xticks(list(x), [m for m, _, _ in pairs])
    ax.set(ylabel="action Hz", title="Skipping the masked camera (LIBERO)")
    ax.legend()
    return _save(fig, out / "camera_skip.png")


def roofline(roof: dict, out: pathlib.Path) -> pathlib.Path:
    """Measured time of each phase next to its compute/bandwidth floor (log scale)."""
    phases = roof["phases"]
    fig, ax = plotting.pyplot().subplots(figsize=(7, 3.8))
    x = range(len(phases))
    ax.bar([i - 0.2 for i in x], [p["ms"] for p in phases], 0.4, label="measured")
    ax.bar([i + 0.2 for i in x], [p["floor_ms"] for p in phases], 0.4, label="floor")
    ax.set_xticks(list(x), [f"{p['phase']}\n({p['bound'][:4]})" for p in phases], fontsize=7)
    ax.set(yscale="log", ylabel="ms", title="Phases vs roofline floor")
    ax.legend()
    return _save(fig, out / "roofline.png")


SERVING_COLOURS = {"action_only": "tab:gray", "frame": "tab:blue", "async": "tab:orange"}
SERVING_METRICS = (
    ("action_latency_ms_p99", "action latency p99 (ms)"),
    ("text_latency_ms_p50", "text latency p50 (ms)"),
    ("tokens_per_s", "finished text tokens/s"),
)


def serving(results: dict, out: pathlib.Path) -> pathlib.Path | None:
    """`--serving` results against the robots' think time T: one row per number of robots R, one column
    per metric, one line per mode (drawn when some R has more than one T)."""
    by_robots: dict[int, list[dict]] = {}
    for setting in results["settings"].values():
        by_robots.setdefault(setting["setting"]["robots"], []).append(setting)
    robots = sorted(r for r, group in by_robots.items() if len(group) > 1)
    if not robots:
        return None
    fig, axes = plotting.pyplot().subplots(
        len(robots), len(SERVING_METRICS), figsize=(12, 3 * len(robots)), squeeze=False
    )
    for row, r in zip(axes, robots, strict=True):
        group = sorted(by_robots[r], key=lambda s: s["setting"]["think_ms"])
        for ax, (metric, name) in zip(row, SERVING_METRICS, strict=True):
            for mode in group[0]["modes"]:
                points = [
                    (s["setting"]["think_ms"], s["modes"][mode][metric])
                    for s in group
                    if s["modes"][mode][metric] is not None
                ]
                if points and not (metric != "action_latency_ms_p99" and mode == "action_only"):
                    ax.plot(
                        *zip(*points, strict=True), marker="o", label=mode, color=SERVING_COLOURS.get(mode)
                    )
            ax.set(xlabel="robot think time T (ms)", ylabel=name, title=f"R={r}")
            ax.legend(fontsize=8)
    return _save(fig, out / "serving.png")


def write_all(runs: list[dict], roof: dict, out: pathlib.Path) -> list[pathlib.Path]:
    drawn = [
        speedup_vs_n_k(runs, out),
        ablation_bars(runs, roof, out),
        workloads(runs, out),
        tradeoff(runs, out),
        steps(runs, out),
        camera_skip(runs, out),
        roofline(roof, out),
    ]
    return [p for p in drawn if p is not None]
