"""The main job: actions every frame and language batched across frames, from one shared KV cache.

  oxygen-run                      # pi05_demo: the shipped demo model on rendered table scenes
  oxygen-run --config=pi05_cpu    # the CPU benchmark model, random init, synthetic LIBERO camera
  oxygen-run --config=pi05_libero --checkpoint_dir=pi05_libero --target_hz=50 \
      --arrivals=poisson --rate=0.5 --out=summary.json
  oxygen-run --loop=async --robots=4 --think_ms=300 --seconds=20   # robots on the device loop

By default frames follow a frame clock with the `--arrivals` workload. With `--loop=async|frame` the same
engine serves `--robots` closed-loop robots instead: each sends an observation, waits for its actions,
executes them for `--think_ms`, and starts a language request whenever its previous one is done, on the
device loop (`async`: language in idle time; `frame`: `--k` tokens per frame, before the replies).

Default config: pi05_demo, the demo model shipped in the package (docs/cli.md).
"""

import itertools
import json

import jax
import numpy as np
import tqdm
from absl import flags

from oxygen_jax import config, preflight
from oxygen_jax.benchmarks import arrivals, metrics, observations, serving
from oxygen_jax.engine.compile_counter import CompileCounter
from oxygen_jax.runtime import runtime
from oxygen_jax.runtime.requests import TextRequest
from oxygen_jax.runtime.runtime import RuntimeConfig
from oxygen_jax.runtime.scheduler import FrameInput
from oxygen_jax.table_task import scenes as table_scenes
from oxygen_jax.tools import cli

_MODEL = cli.define_model_flags("pi05_demo")
_MAX_TEXT = cli.define_max_text_tokens()
_DECODE = cli.define_decode_step_flags()
_OUT = cli.define_out_flag(None, "Write the run summary (JSON) to this file.")
_OBS_DIR = flags.DEFINE_string("obs_dir", None, "Folder of recorded npz frames (synthetic when absent).")
_LAYOUT = flags.DEFINE_enum(
    "layout", "libero", sorted(observations.LAYOUTS), "Robot whose cameras the synthetic stream fills."
)
_PROMPT = flags.DEFINE_string("prompt", observations.DEFAULT_PROMPT, "Task prompt of the synthetic stream.")
_FRAMES = flags.DEFINE_integer(
    "frames", 60, "Frames with new observations (arrivals happen in these).", lower_bound=1
)
_DRAIN = flags.DEFINE_bool("drain", True, "After the last frame, keep acting until every request finished.")
_ARRIVALS = flags.DEFINE_enum("arrivals", "uniform", arrivals.KINDS, "Language request arrival pattern.")
_RATE = cli.positive(
    flags.DEFINE_float("rate", 1.0, "Requests per frame (uniform/random_length) or Poisson lambda.")
)
_LENGTHS = flags.DEFINE_list("lengths", ["5", "20"], "Short,long request lengths for random_length.")
flags.register_validator(
    _LENGTHS,
    lambda lengths: len(lengths) == 2 and all(x.isdigit() and int(x) > 0 for x in lengths),
    message="expects two positive token counts: short,long",
)
_LONG_FRACTION = flags.DEFINE_float(
    "long_fraction", 0.5, "Fraction of long requests (random_length).", lower_bound=0, upper_bound=1
)
_SLOTS = flags.DEFINE_integer(
    "max_slots", None, "Batch state slots (config's engine.max_slots).", lower_bound=1
)
_TEMPERATURE = flags.DEFINE_float("temperature", 0.0, "Text sampling temperature (0: greedy).", lower_bound=0)
_SEED = flags.DEFINE_integer("seed", 0, "Seed for init, observations, arrivals and sampling.")
_PRINT_TEXT = flags.DEFINE_integer("print_text", 3, "Print the first N finished texts.", lower_bound=0)
_LOOP = flags.DEFINE_enum("loop", None, ["async", "frame"], "Serve closed-loop robots on the device loop.")
_ROBOTS = flags.DEFINE_integer("robots", 1, "--loop: robots sending observations.", lower_bound=1)
_THINK_MS = flags.DEFINE_float(
    "think_ms", 300.0, "--loop: how long a robot executes its actions.", lower_bound=0
)
_SECONDS = cli.positive(flags.DEFINE_float("seconds", 20.0, "--loop: how long the robots run."))


def serve_robots(engine, stream, max_new: int, num_steps: int) -> dict:
    """--loop: the robot workload of `benchmarks/serving.py` on this engine."""
    setting = serving.Setting(
        _ROBOTS.value, _THINK_MS.value, max_new=max_new, frame_k=_DECODE.k.value, seconds=_SECONDS.value
    )
    frames = [next(stream) for _ in range(8)]
    print(f"{setting.name}: {_LOOP.value} loop, warming up, then {setting.seconds:g} s of robots...")
    return {
        "config": _MODEL.config.value.name,
        "setting": setting.name,
        **serving.run_mode(engine, frames, _LOOP.value, setting, num_steps),
    }


def _stream_kind(cfg) -> str:
    """What the frames show: recorded npz frames (`obs_dir`), rendered table scenes (`table`, the table
    robot's configs) or the synthetic stream of a robot's camera layout (`--layout`)."""
    if _OBS_DIR.value:
        return "obs_dir"
    return "table" if cfg.get("robot") == "table" else _LAYOUT.value


def _layout_line(engine, stream_frame: dict, prefix_len: int) -> str:
    """Which cameras the stream fills and the prefix they make: the action rate depends on both."""
    config = engine.config
    visible = [cam for cam in config.image_keys if stream_frame[f"image_mask/{cam}"].all()]
    kind = _stream_kind(_MODEL.config.value)
    named = {"obs_dir": _OBS_DIR.value, "table": "rendered table scenes"}
    source = named.get(kind, f"synthetic {kind} layout")
    return (
        f"{source}: cameras {', '.join(visible)} ({len(config.image_keys) - len(visible)} of "
        f"{len(config.image_keys)} masked); prefix {prefix_len} columns = {len(visible)} x "
        f"{config.image_tokens} image tokens + {prefix_len - len(visible) * config.image_tokens} prompt"
    )


def _print_texts(texts: list, random_model: bool, scenes: list[table_scenes.Scene]) -> None:
    """The first finished texts; `scenes` (table scenes, one per frame) give their prompt and true subtask."""
    if random_model and texts:
        print("random-initialized model: its text is noise, so token ids are shown (pass --checkpoint_dir)")
    shown_texts = texts[: _PRINT_TEXT.value]
    if shown_texts:
        print(f"the first {len(shown_texts)} of {len(texts)} finished requests (--print_text=N shows N):")
    for result in shown_texts:
        shown = result.tokens.tolist() if random_model else repr(result.text)
        print(f"request {result.request_id} ({result.finish_reason}, {len(result.tokens)} tokens): {shown}")
        if scenes:
            scene = scenes[result.arrival_frame]
            print(f"  scene: {scene.prompt!r}, true subtask {scene.subtask!r}")


def main(_):
    cfg = _MODEL.config.value
    _MODEL.preflight()
    if _OUT.value:
        preflight.writable(_OUT.value, folder=False)
    # A recorded stream is opened first, so a wrong --obs_dir fails before the model is built.
    recorded = observations.npz_stream(_OBS_DIR.value) if _OBS_DIR.value else None
    engine = cli.build_engine(cfg, _MODEL.checkpoint_dir.value, _SEED.value, _MODEL.params_dtype_value())
    tokenizer = config.build_tokenizer(cfg, _MODEL.tokenizer_path.value)
    max_new = cli.max_text_tokens(_MAX_TEXT, cfg)
    lengths = tuple(int(x) for x in _LENGTHS.value) if _ARRIVALS.value == "random_length" else (max_new,)
    max_new = max(max_new, *lengths)
    target_hz = _DECODE.target_hz.value
    frames = runtime.build(
        engine,
        RuntimeConfig(
            max_slots=_SLOTS.value or cfg.engine.max_slots,
            max_new_tokens=max_new,
            loop=None,  # the frame clock below drives it
            k=_DECODE.k.value,
            target_hz=target_hz,
            num_steps=_MODEL.num_steps.value or cfg.num_steps,
            max_prefill_batch=1,
            seed=_SEED.value,
        ),
        detokenize=tokenizer.detokenize,
    )
    manager = frames.manager
    scenes: list[table_scenes.Scene] = []  # per frame of a table-scene stream
    if recorded:
        stream = recorded
    elif _stream_kind(cfg) == "table":
        stream = _table_frames(cfg, scenes)
    else:
        stream = observations.synthetic_stream(
            engine.config, tokenizer, _PROMPT.value, _SEED.value, observations.LAYOUTS[_LAYOUT.value]
        )
    if _LOOP.value:
        report(serve_robots(engine, stream, max_new, _MODEL.num_steps.value or cfg.num_steps))
        return
    pattern = arrivals.ArrivalPattern(
        _ARRIVALS.value, _RATE.value, lengths, _LONG_FRACTION.value, _SEED.value
    )

    print(f"{cfg.name}: {engine.config.dtype} on {jax.default_backend()}; warming up...")
    first = next(stream)
    frames.warmup(first)
    first_frame = len(scenes)  # frames the warm-up took
    print(_layout_line(engine, first, manager.prefix_len))
    print(f"{manager.max_slots} slots x {max_new} tokens: batch state {manager.state_bytes / 2**20:.1f} MiB")
    stats, texts, arrived = metrics.RunStats(), [], 0
    with CompileCounter() as counter:
        progress = tqdm.tqdm(desc="frames", unit="frame", total=_FRAMES.value)
        for frame in itertools.count():
            if frame == _FRAMES.value:
                if not (_DRAIN.value and (manager.active or manager.queued)):
                    break
                # The drain's length is known only as requests finish: its own bar counts them.
                progress.close()
                progress = tqdm.tqdm(desc="drain", unit="request", total=manager.active + manager.queued)
            elif frame > _FRAMES.value and not (manager.active or manager.queued):
                break
            requests = []
            if frame < _FRAMES.value:
                for length in pattern.lengths_at(frame):
                    requests.append(
                        TextRequest(
                            arrived, length, temperature=_TEMPERATURE.value, seed=_SEED.value + arrived
                        )
                    )
                    arrived += 1
            result = frames.step([FrameInput(next(stream), requests=requests)])
            stats.add(result)
            texts += result.finished
            progress.update(1 if frame < _FRAMES.value else len(result.finished))
            progress.set_postfix(
                {k: f"{v:.1f}" for k, v in stats.live().items()}
                | {"k": result.k, "batch": result.decode_batch}
            )
        progress.close()

    summary = {
        "config": cfg.name,
        "backend": jax.default_backend(),
        "dtype": engine.config.dtype,
        "layout": _stream_kind(cfg),
        "prefix_len": manager.prefix_len,
        "arrivals": _ARRIVALS.value,
        "rate": _RATE.value,
        "k": "deadline" if target_hz else _DECODE.k.value,
        "target_hz": target_hz,
        "requests_arrived": arrived,
        **stats.summary(),
        # Frames with arrivals (the `frames` bar's count), then the drain's until every request finished.
        "frames": min(len(stats.frames), _FRAMES.value),
        "drain_frames": max(len(stats.frames) - _FRAMES.value, 0),
        "queue_wait_frames_mean": float(np.mean([t.queue_wait_frames for t in texts])) if texts else 0.0,
        "compiles_after_warmup": counter.count,
        "peak_memory_bytes": metrics.peak_memory_bytes(),
        "state_bytes": manager.state_bytes,
    }
    scenes = scenes[first_frame:]
    if scenes and texts:
        # The share of finished requests that said their scene's true subtask (a trained demo model: 1.0).
        said = [t.text == scenes[t.arrival_frame].subtask for t in texts]
        summary["subtask_exact_match"] = float(np.mean(said))
    random_model = config.checkpoint_for(cfg, _MODEL.checkpoint_dir.value) is None
    _print_texts(texts, random_model, scenes)
    report(summary)


def report(summary: dict) -> None:
    print(json.dumps(summary, indent=1))
    if _OUT.value:
        with open(_OUT.value, "w") as f:
            json.dump(summary, f, indent=1)


def _table_frames(cfg, scenes: list[table_scenes.Scene]):
    """Rendered table scenes as model frames, noting each scene in `scenes`."""
    for scene, frame in table_scenes.model_stream(cfg, _MODEL.checkpoint_dir.value, _SEED.value):
        scenes.append(scene)
        yield frame


def run() -> None:
    """The `oxygen-run` command."""
    cli.run(main)


if __name__ == "__main__":
    run()
