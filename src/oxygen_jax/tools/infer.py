"""Offline pi0.5 inference on one observation batch: actions, and optionally text, to an npz file.

  oxygen-infer --scene=3 --max_text_tokens=12     # the shipped demo model on a rendered table scene
  oxygen-infer --config=pi05_tiny --checkpoint_dir=CKPT --obs=obs.npz --out=out.npz \
      --max_text_tokens=24
  oxygen-infer --max_text_tokens=16 --text_task="narration:describe what you are doing" \
      --text_task="memory:where is the cup"

Each `--text_task=name:instruction` (repeatable) is a language task on the same observation: its
instruction is appended to the shared prefix (`Engine.extend`, one call for every task and row) and
`text_task/<name>` holds its text per row (`text_task_tokens/<name>` the tokens).

Default config: pi05_demo, the demo model shipped in the package (docs/cli.md). `--scene=SEED` renders
the table scene of that seed for a table config (the demo model's own task: its text should be the scene's
true subtask, printed beside it). `--obs` holds model-level arrays (`image/<camera>`,
`image_mask/<camera>`, `tokenized_prompt`, `tokenized_prompt_mask`, optional `noise`); without either, a
synthetic observation (random images) is used.

`--rtc=FILE.npz` guides the actions towards previous chunks (real-time chunking, docs/rtc.md): FILE holds
`prev_chunk` [B, H, 32] (model space, aligned: prev_chunk[b, i] is what robot b executes at the new
chunk's index i), `d` [B] (actions executed before the new chunk arrives) and `s` [B] (the chunk blends
into prev_chunk up to s) as ints; d = s = 0 leaves a row unguided.
  oxygen-infer --config=pi05_tiny --obs=obs.npz --rtc=prev.npz --rtc_schedule=linear \
      --max_guidance_weight=1 --out=out.npz
"""

import time

import jax
import numpy as np
from absl import flags

from oxygen_jax import config, preflight
from oxygen_jax.engine.api import ChunkGuidance
from oxygen_jax.engine.guidance import SCHEDULES
from oxygen_jax.models import inputs
from oxygen_jax.table_task import scenes as table_scenes
from oxygen_jax.tools import cli

_MODEL = cli.define_model_flags("pi05_demo")
_MAX_TEXT = cli.define_max_text_tokens()
_OUT = cli.define_out_flag(None, "npz to write actions (and text outputs) to.")
_SEED = flags.DEFINE_integer("seed", 0, "Seed for random init, synthetic inputs and noise.")
_OBS = flags.DEFINE_string("obs", None, "npz of model-level input arrays (synthetic when absent).")
_SCENE = flags.DEFINE_integer("scene", None, "Table configs: render the table scene of this seed as input.")
_BATCH = flags.DEFINE_integer("batch", 1, "Batch size of the synthetic observation.", lower_bound=1)
_TEMPERATURE = flags.DEFINE_float("temperature", 0.0, "Text sampling temperature (0: greedy).", lower_bound=0)
_TOP_P = cli.positive(flags.DEFINE_float("top_p", 1.0, "Nucleus sampling mass for text.", upper_bound=1))
_TEXT_TASKS = flags.DEFINE_multi_string(
    "text_task", [], "name:instruction of a language task on the same observation (repeatable)."
)
_SCORE = flags.DEFINE_string("score_tokens", None, "npy of int [B, N] continuations to score.")
_RTC = flags.DEFINE_string("rtc", None, "npz of prev_chunk [B, H, 32], d [B], s [B]: guided actions.")
_RTC_SCHEDULE = flags.DEFINE_enum("rtc_schedule", "exp", SCHEDULES, "How --rtc's weights fall over [d, s).")
_MAX_GUIDANCE = flags.DEFINE_float(
    "max_guidance_weight", 5.0, "--rtc's largest guidance weight (beta).", lower_bound=0
)


def _timed(fn):
    """(result, seconds of the first call incl. compilation, seconds of a second, compiled call)."""
    start = time.perf_counter()
    result = jax.block_until_ready(fn())
    first = time.perf_counter() - start
    start = time.perf_counter()
    jax.block_until_ready(fn())
    return result, first, time.perf_counter() - start


def _text_tasks(
    engine, tokenizer, cache, batch: int, max_text: int, lines: list[str]
) -> dict[str, np.ndarray]:
    """Every --text_task on every row from one extension of the shared prefix and one decode."""
    if max_text <= 0:
        cli.fail("--text_task needs --max_text_tokens > 0")
    tasks = []
    for spec in _TEXT_TASKS.value:
        name, sep, instruction = spec.partition(":")
        if not sep or not name or not instruction.strip():
            cli.fail(f"--text_task: expected name:instruction, got {spec!r}")
        tasks.append((name, tokenizer.tokenize_task(instruction)))
    if len({name for name, _ in tasks}) != len(tasks):
        cli.fail(f"--text_task: names must be unique, got {[name for name, _ in tasks]}")
    rows = np.tile(np.arange(batch), len(tasks))
    suffixes = [suffix for _, suffix in tasks for _ in range(batch)]
    extended = engine.extend(cache, rows, suffixes)
    text = engine.generate(
        extended, max_text, temperature=_TEMPERATURE.value, top_p=_TOP_P.value, seed=_SEED.value
    )
    out = {}
    for t, (name, _) in enumerate(tasks):
        tokens = np.asarray(text.tokens[t * batch : (t + 1) * batch], np.int32)
        out[f"text_task_tokens/{name}"] = tokens
        out[f"text_task/{name}"] = np.array([tokenizer.detokenize(row) for row in tokens], dtype=str)
        lines += [f"  task {name!r} row {i}: {str(x)!r}" for i, x in enumerate(out[f"text_task/{name}"])]
    return out


def _rtc_rows(path: str, batch: int, horizon: int, action_dim: int) -> list[ChunkGuidance]:
    """One ChunkGuidance per row from an --rtc file (InputError naming the key when malformed)."""
    with np.load(path) as f:
        arrays = dict(f)
    prev = inputs.require_array(arrays, "prev_chunk")
    inputs.check_array("prev_chunk", prev, (batch, horizon, action_dim), "f", "float [B, H, A]")
    delay, end = inputs.require_array(arrays, "d"), inputs.require_array(arrays, "s")
    inputs.check_array("d", delay, (batch,), "iu", "int [B]")
    inputs.check_array("s", end, (batch,), "iu", "int [B]")
    return [
        ChunkGuidance(prev[b], int(delay[b]), int(end[b]), _RTC_SCHEDULE.value, _MAX_GUIDANCE.value)
        for b in range(batch)
    ]


def _scene_arrays(cfg, lines: list[str]) -> dict[str, np.ndarray]:
    """--scene: the table scene of that seed through the table robot's transforms, as a batch of one."""
    scene, arrays = next(table_scenes.model_stream(cfg, _MODEL.checkpoint_dir.value, _SCENE.value))
    lines.append(f"scene {_SCENE.value}: prompt {scene.prompt!r}, true subtask {scene.subtask!r}")
    return arrays


def main(_):
    cfg = _MODEL.config.value
    max_text = cli.max_text_tokens(_MAX_TEXT, cfg)
    if _OBS.value and _SCENE.value is not None:
        cli.fail("give at most one of --obs and --scene")
    if _SCENE.value is not None and cfg.get("robot") != "table":
        cli.fail(f"--scene renders table scenes; config {cfg.name!r} has robot {cfg.get('robot')!r}")
    _MODEL.preflight(needs_tokenizer=max_text > 0 or bool(_TEXT_TASKS.value) or _SCENE.value is not None)
    for flag in (_OBS, _RTC, _SCORE):
        preflight.numpy_file(flag.value, flag.name)
    if _OUT.value:
        preflight.writable(_OUT.value, folder=False)
    engine = cli.build_engine(cfg, _MODEL.checkpoint_dir.value, _SEED.value, _MODEL.params_dtype_value())
    model = engine.config
    lines = []
    if _OBS.value:
        with np.load(_OBS.value) as f:
            arrays = dict(f)
    elif _SCENE.value is not None:
        arrays = _scene_arrays(cfg, lines)
    else:
        arrays = inputs.synthetic_arrays(model, _BATCH.value, seed=_SEED.value)
    obs = inputs.observation_from_arrays(arrays, model)
    batch = obs.tokenized_prompt.shape[0]
    noise = inputs.noise_from_arrays(arrays, model, batch)
    if noise is None:
        noise = engine.noise(jax.random.key(_SEED.value), batch)
    num_steps = _MODEL.num_steps.value or cfg.num_steps
    guidance = _rtc_rows(_RTC.value, batch, *noise.shape[1:]) if _RTC.value else []

    cache, prefill_first, prefill_s = _timed(lambda: engine.prefill(obs))
    actions, denoise_first, denoise_s = _timed(lambda: engine.denoise(cache, noise, num_steps, guidance))
    out = {"actions": np.asarray(actions)}
    lines += [
        f"config {cfg.name} ({model.dtype}), batch {batch}, prefix {model.prefix_len} columns",
        f"actions {list(out['actions'].shape)}",
        f"prefill {prefill_s * 1e3:.1f} ms (first call {prefill_first:.2f} s incl. compile)",
        f"denoise {num_steps} steps{' (guided)' if guidance else ''} {denoise_s * 1e3:.1f} ms"
        f" (first call {denoise_first:.2f} s)",
    ]
    if max_text > 0:
        tokenizer = config.build_tokenizer(cfg, _MODEL.tokenizer_path.value)
        text, text_first, text_s = _timed(
            lambda: engine.generate(
                cache,
                max_text,
                temperature=_TEMPERATURE.value,
                top_p=_TOP_P.value,
                seed=_SEED.value,
            )
        )
        out["text_tokens"] = np.asarray(text.tokens, np.int32)
        out["text_logprobs"] = np.asarray(text.logprobs, np.float32)
        out["text"] = np.array([tokenizer.detokenize(row) for row in out["text_tokens"]], dtype=str)
        lines.append(f"text {max_text} tokens {text_s * 1e3:.1f} ms (first call {text_first:.2f} s)")
        lines += [f"  row {i}: {str(t)!r}" for i, t in enumerate(out["text"])]
    if _TEXT_TASKS.value:
        tokenizer = config.build_tokenizer(cfg, _MODEL.tokenizer_path.value)
        out.update(_text_tasks(engine, tokenizer, cache, batch, max_text, lines))
    if _SCORE.value:
        tokens = np.load(_SCORE.value)
        if tokens.ndim != 2 or tokens.shape[0] != batch or tokens.dtype.kind not in "iu":
            cli.fail(f"--score_tokens: expected int [{batch}, N], got {tokens.dtype} {list(tokens.shape)}")
        out["score_token_logprobs"] = np.asarray(engine.score(cache, tokens), np.float32)
        lines.append(
            f"scored {list(tokens.shape)} tokens: sum log p per row {out['score_token_logprobs'].sum(1)}"
        )
    print("\n".join(lines))
    if _OUT.value:
        np.savez(_OUT.value, **out)
        print(f"wrote {_OUT.value}: {sorted(out)}")


def run() -> None:
    """The `oxygen-infer` command."""
    cli.run(main)


if __name__ == "__main__":
    run()
