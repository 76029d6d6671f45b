"""The GPU lab's results: results.md (tables a reader compares by eye), summary.json, one plot."""

import json
import pathlib


def _ms(entry: dict, key: str = "min_ms") -> str:
    return f"{entry[key]:.2f}" if key in entry else "-"


def markdown(summary: dict) -> str:
    lines = [
        f"# GPU lab: {', '.join(r['config'] for r in summary['runs'])} on {summary['device']}",
        "",
        f"Command: `{summary['command']}`; {summary['date']}; commit {summary['commit']}; "
        f"jax {summary['jax']}; {summary['seconds']:.0f} s.",
    ]
    for run in summary["runs"]:
        m = run["machine"]
        lines += [
            "",
            f"## {run['config']} ({run['dtype']})",
            "",
            f"Action horizon {run['action_horizon']}, {run['num_steps']} flow steps, {len(run['cameras'])} "
            f"cameras ({', '.join(run['cameras'])}), a prompt of {run['prompt_tokens']} tokens in "
            f"{run['prompt_columns']} columns; peaks {m['matmul_flops_per_s'] / 1e12:.1f} TFLOP/s, "
            f"{m['bandwidth_bytes_per_s'] / 1e9:.0f} GB/s.",
            "",
            "| phase | min ms | median ms | floor ms | x floor | kernels/call | busy | top kernel (share) |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for name, p in run["phases"].items():
            if "skipped" in p:
                lines.append(f"| {name} | skipped: {p['skipped']} | | | | | | |")
                continue
            prof = p["profile"]
            top = prof["top"][0] if prof["top"] else {"name": "-", "share": 0}
            x_floor = f"{p['x_floor']:.1f}" if "x_floor" in p else "-"
            lines.append(
                f"| {name} | {_ms(p)} | {_ms(p, 'median_ms')} | {_ms(p, 'floor_ms')} | {x_floor} | "
                f"{prof['kernels_per_call']:.0f} ({prof['where']}) | {prof['busy_fraction']:.2f} | "
                f"`{top['name'][:48]}` ({top['share']:.2f}) |"
            )
        lines += [
            "",
            "| variant | prefill ms | denoise ms | action frame ms | max abs / rel diff |",
            "|---|---|---|---|---|",
        ]
        for v in run["variants"]:
            if "skipped" in v or "error" in v:
                lines.append(f"| {v['name']} | {v.get('skipped') or v['error']} | | | |")
                continue
            lines.append(
                f"| {v['name']} | {_ms(v['prefill'])} | {_ms(v['denoise'])} | {_ms(v['action_frame'])} | "
                f"{v['max_abs_diff']:.2e} / {v['max_rel_diff']:.2e} |"
            )
        lines += ["", "| attention shape | impl | B x queries x keys | min ms |", "|---|---|---|---|"]
        for a in run["attention"]:
            size = f"{a['batch']} x {a['queries']} x {a['keys']}" if "batch" in a else a.get("skipped", "")
            lines.append(f"| {a['shape']} | {a['impl']} | {size} | {_ms(a)} |")
    return "\n".join(lines) + "\n"


def plot(summary: dict, path: pathlib.Path) -> pathlib.Path | None:
    """Each config's phases against their floors (log scale); None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    runs = summary["runs"]
    fig, axes = plt.subplots(1, len(runs), figsize=(7 * len(runs), 4), squeeze=False)
    for ax, run in zip(axes[0], runs, strict=True):
        names = [n for n, p in run["phases"].items() if "min_ms" in p]
        measured = [run["phases"][n]["min_ms"] for n in names]
        floor = [run["phases"][n].get("floor_ms", 0) for n in names]
        xs = range(len(names))
        ax.bar([x - 0.2 for x in xs], measured, 0.4, label="measured (min)")
        ax.bar([x + 0.2 for x in xs], floor, 0.4, label="roofline floor")
        ax.set_xticks(list(xs), names, rotation=45, ha="right", fontsize=8)
        ax.set_yscale("log")
        ax.set_ylabel("ms")
        ax.set_title(f"{run['config']} ({run['dtype']})")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write(summary: dict, out: pathlib.Path) -> list[pathlib.Path]:
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    (out / "results.md").write_text(markdown(summary))
    written = [out / "summary.json", out / "results.md"]
    figure = plot(summary, out / "phases.png")
    return written + ([figure] if figure else [])
