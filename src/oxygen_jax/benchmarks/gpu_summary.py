"""The GPU run's results as the few files a lent machine's output folder carries back (at most 8, flat).

scripts/gpu_benchmark.sh leaves a work folder:
  ablation/       scripts/benchmark.py --out of the ablation modes (roofline.json, runs/*.json)
  serving/        --out of the serving benchmark (serving.json), when time was left for it
  rtc/            --out of the guided-denoise cost (rtc_cost.json), when time was left for it
  stages.tsv      one line per stage: name, exit status (or `skipped`), seconds
  nvidia-smi.txt  the GPU as the driver sees it
`write` turns it into summary.json (the headline figures and every record), results.md (the tables) and
the plots; the script adds the log's tail as the last file. A stage that stopped early leaves out what it
did not reach, and the summary says which stages ended how.
"""

import importlib.metadata
import json
import pathlib
import shutil
import sys

from oxygen_jax.benchmarks import plots, report, roofline
from oxygen_jax.benchmarks.gpu_image import Wheel

# Ceilings of a known device, next to those the run measures itself (`roofline.machine`).
REFERENCE_PEAKS = {
    "H200": {
        "matmul_flops_per_s": 790e12,  # bf16 8192^3 products measured on the lent H200 (769 to 798)
        "bandwidth_bytes_per_s": 4.8e12,  # HBM3e, the vendor's datasheet
    }
}
MAX_FILES = 8
MAX_FILE_BYTES = 16 * 2**20
SUMMARY_FILES = MAX_FILES - 1  # the script writes the log's tail beside them
HEADLINE_MODES = ("action_only", "isolated", "oxygen")
PLOT_ORDER = ("ablation.png", "roofline.png", "serving.png")
VERSIONS = ("jax", "jaxlib", "jax-cuda13-plugin", "jax-cuda12-plugin", "flax", "numpy", "orbax-checkpoint")


def reference_peaks(device_kind: str) -> dict[str, float] | None:
    return next((peaks for name, peaks in REFERENCE_PEAKS.items() if name in device_kind), None)


def reference_phases(roof: dict, peaks: dict[str, float]) -> list[dict]:
    """Each measured phase against its floor at `peaks` instead of the peaks measured in the run."""
    out = []
    for phase in roof["phases"]:
        floor_s, bound = roofline.floor(phase["flops"], phase["bytes"], peaks)
        out.append(
            {
                "phase": phase["phase"],
                "ms": phase["ms"],
                "floor_ms": floor_s * 1e3,
                "bound": bound,
                "x_floor": phase["ms"] / (floor_s * 1e3),
            }
        )
    return out


def headline(quick: dict) -> dict[str, float]:
    """Action Hz of each headline mode, tokens/s of the language modes, oxygen's speedup, σ̂'s memory."""
    out = {}
    for mode in HEADLINE_MODES:
        if record := quick["modes"].get(mode):
            out[f"{mode}_hz"] = record["action_hz"]
            if mode != "action_only":
                out[f"{mode}_tokens_per_s"] = record["tokens_per_s"]
    if "speedup_vs_isolated" in quick:
        out["oxygen_speedup_vs_isolated"] = quick["speedup_vs_isolated"]
    if memory := quick["memory"]:
        out["sigma_hat_bytes"] = memory["state_bytes"]
        out["sigma_hat_slots"] = memory["slots"]
        out["sigma_hat_fraction_of_params"] = memory["state_bytes"] / memory["param_bytes"]
    return out


def rtc_headline(rtc: dict) -> dict[str, float]:
    """What guidance adds to the plain denoise time at each batch (the target: at most 1.5)."""
    return {f"rtc_added_over_plain_b{b['batch']}": b["added_over_plain"] for b in rtc["batches"]}


def read_stages(path: pathlib.Path) -> list[dict]:
    if not path.exists():
        return []
    rows = (line.split("\t") for line in path.read_text().splitlines() if line)
    return [{"stage": name, "status": status, "seconds": int(seconds)} for name, status, seconds in rows]


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def environment(work: pathlib.Path, wheels: list[Wheel]) -> dict:
    """The interpreter, the versions that matter, what the carried wheels installed (the version this
    interpreter finds for each: None if its install failed) and nvidia-smi's view."""
    smi = work / "nvidia-smi.txt"
    return {
        "python": sys.version.split()[0],
        "executable": sys.executable,
        "versions": {name: _version(name) for name in VERSIONS},
        "carried": {w.name: {"wheel": w.version, "found": _version(w.name)} for w in wheels},
        "nvidia_smi": smi.read_text() if smi.exists() else None,
    }


def build(work: pathlib.Path, wheels: list[Wheel]) -> dict:
    summary = {"stages": read_stages(work / "stages.tsv"), "environment": environment(work, wheels)}
    ablation_dir = work / "ablation"
    if (roof_path := ablation_dir / "roofline.json").exists():
        roof = json.loads(roof_path.read_text())
        runs = report.load_runs(ablation_dir, roof["config"])
        quick = report.quick_summary(runs, roof)
        summary |= {
            "config": roof["config"],
            "device_kind": roof["device_kind"],
            "dtype": roof["dtype"],
            "headline": headline(quick),
        }
        if peaks := reference_peaks(roof["device_kind"]):
            summary["reference"] = {"peaks": peaks, "phases": reference_phases(roof, peaks)}
        summary |= {"quick": quick, "roofline": roof, "runs": runs}
    if (serving := work / "serving" / "serving.json").exists():
        summary["serving"] = json.loads(serving.read_text())
    if (rtc := work / "rtc" / "rtc_cost.json").exists():
        summary["rtc"] = json.loads(rtc.read_text())
        summary.setdefault("headline", {}).update(rtc_headline(summary["rtc"]))
    return summary


def _table(title: str, columns: list[str], rows: list[list[str]]) -> list[str]:
    """A results.md section: its heading, then `rows` under `columns`."""
    lines = [f"## {title}", "", f"| {' | '.join(columns)} |", "|" + "---|" * len(columns)]
    return [*lines, *(f"| {' | '.join(row)} |" for row in rows), ""]


def _reference_table(reference: dict) -> list[str]:
    peaks = reference["peaks"]
    title = (
        f"Against the reference peaks ({peaks['matmul_flops_per_s'] / 1e12:.0f} TFLOP/s, "
        f"{peaks['bandwidth_bytes_per_s'] / 1e12:.1f} TB/s)"
    )
    rows = [
        [p["phase"], f"{p['ms']:.3f}", f"{p['floor_ms']:.3f}", p["bound"], f"{p['x_floor']:.2f}"]
        for p in reference["phases"]
    ]
    return _table(title, ["phase", "measured ms", "floor ms", "bound", "x floor"], rows)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _serving_table(serving: dict) -> list[str]:
    columns = ["setting", "mode", "observations", "action ms p50/p99", "text ms p50/p99", "tokens/s"]
    rows = [
        [
            name,
            mode,
            str(r["observations"]),
            f"{_ms(r['action_latency_ms_p50'])}/{_ms(r['action_latency_ms_p99'])}",
            f"{_ms(r['text_latency_ms_p50'])}/{_ms(r['text_latency_ms_p99'])}",
            f"{r['tokens_per_s']:.1f}",
            _ms(r["mean_decode_batch"]),
        ]
        for name, setting in serving["settings"].items()
        for mode, r in setting["modes"].items()
    ]
    return _table("Serving (robots in closed loop)", [*columns, "decode batch"], rows)


def _rtc_table(rtc: dict) -> list[str]:
    setting = rtc["setting"]
    title = (
        f"Real-time chunking: guided vs plain denoise ({setting['num_steps']} steps, median of "
        f"{setting['reps']} rounds)"
    )
    columns = ["batch", "plain ms", "guided ms", "guided / plain", "added / plain (target <= 1.5)"]
    rows = [
        [
            str(b["batch"]),
            f"{b['plain_ms']:.2f}",
            f"{b['guided_ms']:.2f}",
            f"{b['guided_over_plain']:.2f}",
            f"{b['added_over_plain']:.2f}",
            f"{b['guided_over_plain_flops']:.2f}",
            str(b["compiles_while_measuring"]),
        ]
        for b in rtc["batches"]
    ]
    return _table(title, [*columns, "FLOPs per step, guided / plain", "compilations while measuring"], rows)


def markdown(summary: dict) -> str:
    if "roofline" in summary:
        lines = [report.markdown(summary["runs"], summary["roofline"], summary["quick"])]
    else:
        lines = ["# GPU benchmark: no results (the run stopped before its roofline; see the log's tail)", ""]
    if "reference" in summary:
        lines += _reference_table(summary["reference"])
    if "serving" in summary:
        lines += _serving_table(summary["serving"])
    if "rtc" in summary:
        lines += _rtc_table(summary["rtc"])
    rows = [[s["stage"], s["status"], str(s["seconds"])] for s in summary["stages"]]
    lines += _table("Stages", ["stage", "status", "seconds"], rows)
    env = summary["environment"]
    versions = ", ".join(f"{k} {v}" for k, v in env["versions"].items() if v)
    return "\n".join([*lines, f"Python {env['python']} ({env['executable']}): {versions}", ""])


def _plots(summary: dict, folder: pathlib.Path) -> list[pathlib.Path]:
    """The plots this summary can draw, in PLOT_ORDER first."""
    folder.mkdir(parents=True, exist_ok=True)
    drawn = []
    if "roofline" in summary:
        drawn += plots.write_all(summary["runs"], summary["roofline"], folder)
    if "serving" in summary and (path := plots.serving(summary["serving"], folder)):
        drawn.append(path)
    rank = {name: i for i, name in enumerate(PLOT_ORDER)}
    return sorted(drawn, key=lambda p: rank.get(p.name, len(rank)))


def write(work: pathlib.Path, out: pathlib.Path, wheels: list[Wheel]) -> list[pathlib.Path]:
    """summary.json, results.md and as many plots as fit in SUMMARY_FILES, flat in `out`."""
    summary = build(work, wheels)
    out.mkdir(parents=True, exist_ok=True)
    written = [out / "summary.json", out / "results.md"]
    written[0].write_text(json.dumps(summary, indent=1) + "\n")
    written[1].write_text(markdown(summary))
    for plot in _plots(summary, work / "plots")[: SUMMARY_FILES - len(written)]:
        written.append(pathlib.Path(shutil.copy(plot, out / plot.name)))
    too_large = [p.name for p in written if p.stat().st_size > MAX_FILE_BYTES]
    if too_large:
        raise ValueError(f"over {MAX_FILE_BYTES} bytes, would not come back: {too_large}")
    return written
