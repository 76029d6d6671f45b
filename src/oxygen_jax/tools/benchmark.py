"""Benchmarks: oxygen against its baselines (modes of the same engine), each run in its own processes.

  oxygen-benchmark --quick                      # LIBERO ablation point on pi05_cpu, < 5 min
  oxygen-benchmark --sweeps=ablation,skip,n_k --frames=20
  oxygen-benchmark --config=pi05 --sweeps=ablation --out=DIR   # full size (GPU, bf16)
  oxygen-benchmark --full_forward               # full-size pi05 action chunk, f32 on CPU
  oxygen-benchmark --report_only --out=DIR      # tables and plots from DIR/runs/*.json
  oxygen-benchmark --serving --out=DIR          # closed-loop robots: action_only / frame / async
  oxygen-benchmark --serving --serving_sweep    # R in {1, 4, 16} x think time in {0, 100, 300} ms
  oxygen-benchmark --serving --ray --replicas=1,2 --config=pi05_tiny   # plain server vs Ray Serve fleets
  oxygen-benchmark --multitask --out=DIR        # 3 text tasks per observation: isolated vs shared
  oxygen-benchmark --rtc --out=DIR              # guided (real-time chunking) vs plain denoise
  oxygen-benchmark --check_image                # does the GPU image (+ .whl/) cover every import?
  oxygen-benchmark --gpu_summary=OUT --out=WORK # scripts/gpu_benchmark.sh's results, <= 8 files

Default config: pi05_cpu, the model the recorded figures are measured on (docs/cli.md).
Writes DIR/runs/<run>.json, DIR/roofline.json, DIR/quick.json, DIR/results.md and DIR/*.png;
DIR defaults to benchmarks/results/<machine>.
"""

import dataclasses
import json
import os
import pathlib
import sys
import time

import jax
import tqdm
from absl import flags

from oxygen_jax import config, preflight
from oxygen_jax.benchmarks import (
    fleet,
    gpu_image,
    gpu_summary,
    multitask,
    plots,
    report,
    rtc_cost,
    runner,
    serving,
    spec,
    sweeps,
    worker,
)
from oxygen_jax.tools import cli

ROOT = pathlib.Path(__file__).resolve().parents[3]  # the checkout (src/oxygen_jax/tools/ is three below)
IMAGE_PACKAGES = ROOT / "scripts" / "gpu_image_packages.txt"

_CONFIG = cli.define_config_flag("pi05_cpu")
_QUICK = flags.DEFINE_bool(
    "quick", False, "Only the LIBERO ablation point (isolated, shared_kv, oxygen, action_only)."
)
_SWEEPS = flags.DEFINE_list("sweeps", ["ablation"], f"Sweeps to run, of {', '.join(sweeps.SWEEPS)}.")
_MODES = flags.DEFINE_list(
    "modes", [], "Only these modes of the sweeps, e.g. action_only,isolated,oxygen (or oxygen_deadline)."
)
_FRAMES = flags.DEFINE_integer(
    "frames", 20, "Measured frames per run (after warm-up and fill frames).", lower_bound=1
)
_MAX_TEXT = flags.DEFINE_list(
    "max_text_tokens", ["5", "10", "15", "20", "30"], "Text tokens per request in the n_k sweep."
)
_K = flags.DEFINE_list("k", ["1", "5", "10"], "Decode steps per frame of the n_k sweep.")
_NUM_STEPS = flags.DEFINE_list("num_steps", ["5", "10", "15", "20"], "Denoising steps of the steps sweep.")
_STEPS = flags.DEFINE_list("steps", None, "Deprecated: use --num_steps.")
_DEADLINES = flags.DEFINE_list(
    "deadline_fractions", ["0.5", "0.7", "0.9"], "Deadline-k targets (x action-only Hz)."
)
_OUT = cli.define_out_flag(None, "Results folder (benchmarks/results/<machine> when absent).")
_CACHE = flags.DEFINE_string(
    "jax_cache_dir",
    str(pathlib.Path.home() / ".cache" / "oxygen_jax" / "xla"),
    "Persistent XLA cache ('' off).",
)
_FULL_FORWARD = flags.DEFINE_bool(
    "full_forward", False, "Time one full-size pi05 action chunk (random init)."
)
_SKIP_EXISTING = flags.DEFINE_bool("skip_existing", False, "Keep runs already recorded in --out (resume).")
_SERVING = flags.DEFINE_bool("serving", False, "Robots (R=1 T=300 ms, R=4 T=0): DIR/serving.json.")
_SERVING_SWEEP = flags.DEFINE_bool("serving_sweep", False, "--serving for R in 1,4,16 x T in 0,100,300 ms.")
_SERVING_SECONDS = cli.positive(
    flags.DEFINE_float("serving_seconds", 20.0, "Seconds each serving mode runs.")
)
_RAY = flags.DEFINE_bool(
    "ray", False, "With --serving: oxygen-serve alone vs --ray fleets of it: DIR/fleet_<config>.json."
)
_REPLICAS = flags.DEFINE_list("replicas", ["1", "2"], "--serving --ray: fleet sizes to measure.")
_FLEET_ROBOTS = flags.DEFINE_list("fleet_robots", ["1", "4"], "--serving --ray: robots sending back to back.")
_MULTITASK = flags.DEFINE_bool(
    "multitask", False, "Subtask, narration and memory on every observation: DIR/multitask.json."
)
_MULTITASK_FRAMES = flags.DEFINE_integer(
    "multitask_frames", 8, "Frames of each frame-synchronous mode.", lower_bound=1
)
_MULTITASK_SECONDS = cli.positive(
    flags.DEFINE_float("multitask_seconds", 10.0, "Seconds of each asynchronous mode.")
)
_MULTITASK_THINK = flags.DEFINE_float(
    "multitask_think_ms", 100.0, "Asynchronous modes: ms the robot executes each action chunk.", lower_bound=0
)
_RTC = flags.DEFINE_bool("rtc", False, "Guided vs plain denoise at batch 1 and 4: DIR/rtc_cost.json.")
_REPORT_ONLY = flags.DEFINE_bool("report_only", False, "Rebuild quick.json, results.md and plots from --out.")
_CHECK_IMAGE = flags.DEFINE_bool(
    "check_image",
    False,
    "Whether the GPU machine's image runs this benchmark: every distribution it imports is in "
    f"{IMAGE_PACKAGES.name} or among --wheels_dir's wheels, which fit that image and the travel limit.",
)
_WHEELS_DIR = flags.DEFINE_string(
    "wheels_dir", str(ROOT / ".whl"), "Wheels carried to the GPU machine (--check_image, --gpu_summary)."
)
_GPU_SUMMARY = flags.DEFINE_string(
    "gpu_summary", None, "Write the GPU run's work folder --out as at most 8 files into this folder."
)


def _machine(info: dict) -> str:
    if info["backend"] == "cpu":
        return f"cpu-{os.cpu_count()}core"
    return "gpu-" + info["device_kind"].replace(" ", "_")


def _out_dir(info: dict) -> pathlib.Path:
    out = pathlib.Path(_OUT.value) if _OUT.value else ROOT / "benchmarks" / "results" / _machine(info)
    (out / "runs").mkdir(parents=True, exist_ok=True)
    return out


def _write_json(path: pathlib.Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=1) + "\n")


def _full_forward(cache_dir: str | None) -> None:
    cfg = config.load_config("pi05")
    result = runner.run_task(cfg, spec.RunSpec("action_only"), "full_forward", cache_dir)
    _write_json(_out_dir(result) / "full_forward.json", result)
    print(json.dumps(result, indent=1))


def _report(out: pathlib.Path) -> None:
    roof = json.loads((out / "roofline.json").read_text())
    runs = report.load_runs(out, roof["config"])
    quick = report.quick_summary(runs, roof)
    _write_json(out / "quick.json", quick)
    (out / "results.md").write_text(report.markdown(runs, roof, quick))
    for path in plots.write_all(runs, roof, out):
        print(f"wrote {path}")
    print(json.dumps({k: v for k, v in quick.items() if k != "memory"}, indent=1))


def _fleet(config_name: str) -> None:
    """The plain server and each fleet size at the same load, in subprocesses (see benchmarks/fleet.py)."""
    out = _out_dir({"backend": jax.default_backend(), "device_kind": jax.devices()[0].device_kind})
    load = fleet.FleetLoad(robots=tuple(int(r) for r in _FLEET_ROBOTS.value), seconds=_SERVING_SECONDS.value)
    from oxygen_jax.serving import ray_app  # the ray extra, needed here only

    sizes = [int(n) for n in _REPLICAS.value]
    results = fleet.run(config_name, sizes, load, str(out), ray_app.replica_address)
    _write_json(out / f"fleet_{config_name}.json", results)
    print(fleet.table(results))


def _serving(cfg, cache_dir: str | None) -> None:
    """Every serving mode at each setting, in this process on one engine (compiled once)."""
    worker.setup_jax(cache_dir)
    run_spec = spec.RunSpec("oxygen")
    engine = worker.build_engine(cfg, run_spec)
    observations = [spec.observation(engine.config, run_spec.layout, i) for i in range(8)]
    grid = [(1, 300.0), (4, 0.0)]
    if _SERVING_SWEEP.value:
        grid = [(r, t) for r in (1, 4, 16) for t in (0.0, 100.0, 300.0)]
    info = {
        "config": cfg.name,
        "backend": jax.default_backend(),
        "device_kind": jax.devices()[0].device_kind,
        "mesh": cfg.engine.mesh,
    }
    out = _out_dir(info)
    results = {**info, "settings": {}}
    for robots, think_ms in tqdm.tqdm(grid, desc="serving settings"):
        setting = serving.Setting(robots, think_ms, seconds=_SERVING_SECONDS.value)
        result = serving.run_setting(engine, observations, setting, run_spec.num_steps)
        results["settings"][setting.name] = result | {"device_bytes": worker.device_bytes()}
        _write_json(out / "serving.json", results)
    if path := plots.serving(results, out):
        print(f"wrote {path}")
    print(json.dumps(results, indent=1))


def _multitask(cfg, cache_dir: str | None) -> None:
    """Isolated against shared prefill, frame-synchronous and asynchronous, in this process."""
    worker.setup_jax(cache_dir)
    run_spec = spec.RunSpec("oxygen")
    engine = worker.build_engine(cfg, run_spec)
    observations = [spec.observation(engine.config, run_spec.layout, i) for i in range(8)]
    setting = multitask.Setting(
        frames=_MULTITASK_FRAMES.value, seconds=_MULTITASK_SECONDS.value, think_ms=_MULTITASK_THINK.value
    )
    info = {"config": cfg.name, "backend": jax.default_backend(), "device_kind": jax.devices()[0].device_kind}
    results = {**info, **multitask.run(engine, observations, setting)}
    _write_json(_out_dir(info) / "multitask.json", results)
    print(json.dumps(results, indent=1))


def _rtc_cost(cfg, cache_dir: str | None) -> None:
    """Real-time chunking's cost on the action path, in this process on one engine."""
    worker.setup_jax(cache_dir)
    engine = worker.build_engine(cfg, spec.RunSpec("action_only"))
    info = {"config": cfg.name, "backend": jax.default_backend(), "device_kind": jax.devices()[0].device_kind}
    setting, load_before = rtc_cost.Setting(), os.getloadavg()
    results = {**info, "setting": dataclasses.asdict(setting), "batches": []}
    for batch in setting.batches:  # written after each batch: a run stopped later keeps what it measured
        start = time.perf_counter()
        results["batches"].append(rtc_cost.measure_batch(engine, batch, setting))
        results["load_average_1_5_15min"] = {"before": load_before, "after": os.getloadavg()}
        _write_json(_out_dir(info) / "rtc_cost.json", results)
        print(f"rtc: batch {batch} compiled and measured in {time.perf_counter() - start:.0f} s", flush=True)
    print(json.dumps({**results, "batches": [_summary(b) for b in results["batches"]]}, indent=1))


def _summary(measured: dict) -> dict:
    return {k: v for k, v in measured.items() if not k.endswith("_all")}


def _check_image() -> None:
    """Prints what was checked and `ready`, or what is missing (exit status 1)."""
    startup = gpu_image.startup_modules()
    imported = {name: module for name, module in sys.modules.items() if name not in startup}
    wheels_dir = pathlib.Path(_WHEELS_DIR.value)
    readiness = gpu_image.check(imported, IMAGE_PACKAGES, wheels_dir, ROOT)
    print("\n".join(readiness.lines(wheels_dir)))
    if not readiness.ready:
        sys.exit(1)


# Names --modes takes: the report's labels (a mode, `_deadline` when k follows a target rate, `_noskip`).
MODE_LABELS = {m + d + n for m in spec.MODES for d in ("", "_deadline") for n in ("", "_noskip")}


def _selected(specs: list[spec.RunSpec], modes: list[str]) -> list[spec.RunSpec]:
    """The specs whose mode, as the report labels it, is among `modes`."""
    selected = [s for s in specs if report.label({"spec": dataclasses.asdict(s)}) in modes]
    if not selected:
        cli.fail(f"no run of --sweeps={','.join(_SWEEPS.value)} has a mode among --modes={','.join(modes)}")
    return selected


def main(_):
    if _CHECK_IMAGE.value:
        _check_image()
        return
    if _GPU_SUMMARY.value:
        if not _OUT.value:
            cli.fail("--gpu_summary needs --out (the GPU run's work folder)")
        wheels = gpu_image.read_wheels(pathlib.Path(_WHEELS_DIR.value))
        for path in gpu_summary.write(pathlib.Path(_OUT.value), pathlib.Path(_GPU_SUMMARY.value), wheels):
            print(f"wrote {path}")
        return
    if _RTC.value:
        _rtc_cost(_CONFIG.value, _CACHE.value or None)
        return
    if _MULTITASK.value:
        _multitask(_CONFIG.value, _CACHE.value or None)
        return
    if _SERVING.value and _RAY.value:
        _fleet(_CONFIG.value.name)
        return
    # What follows ends in figures, drawn after minutes of runs: matplotlib and the folder checked first.
    preflight.extra("matplotlib", "benchmark", "drawing the benchmark figures")
    if _OUT.value:
        preflight.writable(_OUT.value, folder=True)
    if _SERVING.value:
        _serving(_CONFIG.value, _CACHE.value or None)
        return
    if _REPORT_ONLY.value:
        if not _OUT.value:
            cli.fail("--report_only needs --out")
        _report(pathlib.Path(_OUT.value))
        return
    cache_dir = _CACHE.value or None
    if _FULL_FORWARD.value:
        _full_forward(cache_dir)
        return
    cfg = _CONFIG.value
    if unknown := set(_MODES.value) - MODE_LABELS:
        cli.fail(f"--modes: unknown {sorted(unknown)}; known: {sorted(MODE_LABELS)}")
    print(f"{cfg.name}: roofline and phase times...")
    roof = runner.run_task(cfg, spec.RunSpec("oxygen"), "roofline", cache_dir)
    out = _out_dir(roof)
    _write_json(out / "roofline.json", roof)
    if _QUICK.value:
        specs = sweeps.quick(_FRAMES.value)
    else:
        grid = sweeps.SweepGrid(
            frames=_FRAMES.value,
            max_new=tuple(int(n) for n in _MAX_TEXT.value),
            k=tuple(int(k) for k in _K.value),
            num_steps=tuple(int(s) for s in cli.renamed(_NUM_STEPS, _STEPS)),
            deadline_fractions=tuple(float(f) for f in _DEADLINES.value),
        )
        specs = sweeps.build(_SWEEPS.value, grid, 1e3 / roof["cost_model"]["action_only_frame_ms"])
    if _MODES.value:
        specs = _selected(specs, _MODES.value)
    path = {s: out / "runs" / f"{cfg.name}_{s.name}.json" for s in specs}
    if _SKIP_EXISTING.value:
        specs = [s for s in specs if not path[s].exists()]
    progress = tqdm.tqdm(specs, desc="runs", unit="run")
    for run_spec in progress:
        progress.set_description(run_spec.name)
        record = runner.run(cfg, run_spec, cache_dir)
        _write_json(path[run_spec], record)
        progress.set_postfix({"Hz": f"{record['action_hz']:.2f}", "tok/s": f"{record['tokens_per_s']:.1f}"})
    _report(out)


def run() -> None:
    """The `oxygen-benchmark` command."""
    cli.run(main)


if __name__ == "__main__":
    run()
