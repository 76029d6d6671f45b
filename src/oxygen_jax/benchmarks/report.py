"""Run records -> quick.json (the ablation point and the targets), a markdown table, and plots' inputs."""

import json
import pathlib

MIB = 2**20
# (name, threshold, higher is better) of each target; values come from `targets`.
TARGETS = {
    "speedup_fraction_of_bound": (0.9, True),
    "oxygen_hz_fraction_of_action_only": (0.9, True),
    "decode_b4_over_b1": (1.3, False),
    "decode_b1_x_floor": (1.5, False),
    "compiles_after_warmup": (0, False),
}


def label(record: dict) -> str:
    """Mode name, with the k policy and camera skipping when they differ from the default."""
    spec = record["spec"]
    name = spec["mode"] + ("_deadline" if spec["target_hz"] else "")
    return name + ("" if spec["skip_masked_cameras"] else "_noskip")


def load_runs(out_dir: pathlib.Path, config: str) -> list[dict]:
    """The run records of one model config (a machine's folder may hold several)."""
    runs = [json.loads(p.read_text()) for p in sorted((out_dir / "runs").glob("*.json"))]
    return [r for r in runs if r["config"] == config]


def ablation(runs: list[dict]) -> dict[str, dict]:
    return {label(r): r for r in runs if r["spec"]["sweep"] == "ablation"}


def _phase(roof: dict, name: str) -> dict:
    return next(p for p in roof["phases"] if p["phase"] == name)


def targets(runs: list[dict], roof: dict) -> dict[str, dict]:
    """Each target's measured value, threshold and whether it is met (absent inputs are skipped)."""
    modes = ablation(runs)
    values = {"compiles_after_warmup": sum(r["compiles_after_warmup"] for r in runs)}
    if {"oxygen", "isolated"} <= modes.keys():
        speedup = modes["oxygen"]["action_hz"] / modes["isolated"]["action_hz"]
        values["speedup_fraction_of_bound"] = speedup / roof["cost_model"]["speedup_bound"]
    if {"oxygen", "action_only"} <= modes.keys():
        values["oxygen_hz_fraction_of_action_only"] = (
            modes["oxygen"]["action_hz"] / modes["action_only"]["action_hz"]
        )
    values["decode_b4_over_b1"] = _phase(roof, "decode_step_b4")["ms"] / _phase(roof, "decode_step_b1")["ms"]
    values["decode_b1_x_floor"] = _phase(roof, "decode_step_b1")["x_floor"]
    out = {}
    for name, value in values.items():
        threshold, higher = TARGETS[name]
        out[name] = {
            "value": value,
            "target": threshold,
            "met": value >= threshold if higher else value <= threshold,
        }
    return out


def memory(runs: list[dict]) -> dict[str, float]:
    """Memory of the ablation modes relative to action-only: the batch state's cost."""
    modes = ablation(runs)
    if not {"oxygen", "action_only"} <= modes.keys():
        return {}
    oxy, act = modes["oxygen"], modes["action_only"]
    out = {
        "state_bytes": oxy["state_bytes"],
        "slots": oxy["slots"],
        "param_bytes": act["param_bytes"],
        "live_bytes_action_only": act["live_bytes_peak"],
        "live_bytes_oxygen": oxy["live_bytes_peak"],
        "live_overhead_fraction": oxy["live_bytes_peak"] / act["live_bytes_peak"] - 1,
        "peak_bytes_action_only": act["peak_memory_bytes"],
        "peak_bytes_oxygen": oxy["peak_memory_bytes"],
        "peak_overhead_fraction": oxy["peak_memory_bytes"] / act["peak_memory_bytes"] - 1,
    }
    if "parallel" in modes:
        out["peak_ratio_parallel_to_action_only"] = (
            modes["parallel"]["peak_memory_bytes"] / act["peak_memory_bytes"]
        )
    return out


def quick_summary(runs: list[dict], roof: dict) -> dict:
    """quick.json: per ablation mode its frame time, action rate and language throughput; oxygen's
    speedup over isolated and the cost-model bound; the targets and the memory overhead."""
    modes = ablation(runs)
    keys = ("frame_ms_mean", "frame_ms_p50", "frame_ms_p99", "action_hz", "tokens_per_s", "avg_batch")
    out = {
        "config": next(iter(modes.values()))["config"] if modes else None,
        "device_kind": roof.get("device_kind"),
        "dtype": roof.get("dtype"),
        "modes": {name: {k: r[k] for k in keys} for name, r in modes.items()},
        "speedup_bound": roof["cost_model"]["speedup_bound"],
        "batching_upper_bound_speedup": roof["cost_model"]["batching_upper_bound_speedup"],
    }
    if {"oxygen", "isolated"} <= modes.keys():
        out["speedup_vs_isolated"] = modes["oxygen"]["action_hz"] / modes["isolated"]["action_hz"]
        out["tokens_speedup_vs_isolated"] = (
            modes["oxygen"]["tokens_per_s"] / modes["isolated"]["tokens_per_s"]
        )
    return out | {"targets": targets(runs, roof), "memory": memory(runs)}


def _load(spec: dict) -> str:
    if spec["arrivals"] == "random_length":
        return f"len {spec['lengths'][0]}/{spec['lengths'][1]}, long {spec['long_fraction']:g}"
    return f"{spec['arrivals']} {spec['rate']:g}"


def _rates(rates: dict[str, float]) -> str:
    return ", ".join(f"{rate / 1e9:.1f} GB/s ({b})" for b, rate in rates.items())


def setting_line(setting: dict) -> str:
    """What the phases ran: action horizon, flow steps, cameras, prompt columns, and the weight split."""
    weights = ", ".join(f"{name} {count / 1e9:.3f} B" for name, count in setting["weights"].items())
    return (
        f"Phases at action horizon {setting['action_horizon']}, {setting['num_steps']} flow steps, "
        f"{len(setting['cameras'])} cameras ({', '.join(setting['cameras'])}), a prompt of "
        f"{setting['prompt_len']} columns ({setting['prefix_len']} prefix columns); "
        f"matmul weights: {weights}."
    )


def markdown(runs: list[dict], roof: dict, quick: dict) -> str:
    lines = [f"# Benchmark results: {quick['config']} on {roof['device_kind']} ({roof['dtype']})", ""]
    m = roof["machine"]
    lines += [
        f"Machine: {roof.get('processor', roof['device_kind'])}; matmul {m['matmul_flops_per_s'] / 1e9:.1f} "
        f"GFLOP/s, bandwidth {m['bandwidth_bytes_per_s'] / 1e9:.1f} GB/s; the model's MLP weights stream "
        f"through the dot kernels at {_rates(roof['mlp_stream_bytes_per_s'])}.",
    ]
    if "setting" in roof:
        lines.append(setting_line(roof["setting"]))
    if "blas_stream_bytes_per_s" in roof:
        lines.append(
            f"The same matmuls in numpy's BLAS ({roof['blas']}): {_rates(roof['blas_stream_bytes_per_s'])}."
        )
    lines += [
        "",
        "| phase | measured ms | floor ms | bound | x floor | stream floor ms | x stream floor |",
        "|---|---|---|---|---|---|---|",
    ]
    for p in roof["phases"]:
        stream = (
            f"{p['stream_floor_ms']:.2f} | {p['x_stream_floor']:.2f}" if "stream_floor_ms" in p else "- | -"
        )
        lines.append(
            f"| {p['phase']} | {p['ms']:.2f} | {p['floor_ms']:.2f} | {p['bound']} | {p['x_floor']:.2f} "
            f"| {stream} |"
        )
    cost = roof["cost_model"]
    lines += [
        "",
        "Cost model (frame ms): "
        + ", ".join(f"{k[: -len('_frame_ms')]} {v:.1f}" for k, v in cost.items() if k.endswith("_frame_ms")),
        f"speedup bound {cost['speedup_bound']:.2f}x, "
        f"perfect batching {cost['batching_upper_bound_speedup']:.2f}x",
        "",
    ]
    if "speedup_vs_isolated" in quick:
        lines += [f"Measured oxygen speedup over isolated: {quick['speedup_vs_isolated']:.2f}x", ""]
    lines += ["| target | value | threshold | met |", "|---|---|---|---|"]
    lines += [
        f"| {k} | {t['value']:.3g} | {t['target']:g} | {'yes' if t['met'] else 'NO'} |"
        for k, t in quick["targets"].items()
    ]
    lines += [
        "",
        "| sweep | mode | layout | S | N | k | load | Hz | frame ms mean/p50/p99 | tok/s | batch | "
        "peak MiB | live MiB | compiles | J/request |",
        "|" + "---|" * 15,
    ]
    for r in runs:
        s = r["spec"]
        k = f"{s['target_hz']:g} Hz" if s["target_hz"] else s["k"]
        energy = f"{r['energy_per_request_j']:.2f}" if "energy_per_request_j" in r else "-"
        lines.append(
            f"| {s['sweep']} | {label(r)} | {s['layout']} | {s['num_steps']} | {s['max_new']} | {k} | "
            f"{_load(s)} | {r['action_hz']:.2f} | "
            f"{r['frame_ms_mean']:.0f}/{r['frame_ms_p50']:.0f}/{r['frame_ms_p99']:.0f} | "
            f"{r['tokens_per_s']:.1f} | {r['avg_batch']:.1f} | {r['peak_memory_bytes'] / MIB:.0f} | "
            f"{r['live_bytes_peak'] / MIB:.1f} | {r['compiles_after_warmup']} | {energy} |"
        )
    return "\n".join(lines) + "\n"
