"""The GPU lab: where one frame's time goes, phase by phase, and what each engine variant changes.

For one model config (random-init params in the backend's compute dtype, one observation of the
config's robot layout): per phase the best and median wall time of repeated calls against the roofline's
floor, a `jax.profiler` trace of a few calls summarized into kernels per call, device-busy fraction and
top kernels (`benchmarks/trace.py`); then every engine variant (the kernel policy's attention, unrolled
loops, GPU compiler options, no prompt buckets) timed on the phases it changes, its actions compared with
the default's; and an attention micro-benchmark at the shapes of vision, prefill, a flow step and a
decode step. Every stage checks the time left first and is skipped, saying so, when it would overrun.
"""

import dataclasses
import statistics
import tempfile
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from oxygen_jax import config as config_lib
from oxygen_jax.benchmarks import roofline, trace
from oxygen_jax.benchmarks.spec import observation
from oxygen_jax.engine import kernels, sampling
from oxygen_jax.engine.api import SamplingParams, SlotInsert
from oxygen_jax.engine.engine import Engine
from oxygen_jax.models import inputs, pi05

# Robot layout (cameras shown) of each config the lab knows; others run the LIBERO layout.
_LAYOUTS = {"pi05_aloha": "aloha", "pi05_droid": "droid"}
DECODE_BATCHES = (1, 4, 6)
OXYGEN_K, OXYGEN_SLOTS, MAX_NEW = 5, 6, 30


@dataclasses.dataclass(frozen=True)
class Variant:
    """An engine built differently from the default: kernel-policy fields and Engine keywords."""

    name: str
    policy: dict = dataclasses.field(default_factory=dict)
    engine: dict = dataclasses.field(default_factory=dict)
    gpu_only: bool = False


VARIANTS = (
    Variant("attention=blocks", policy={"attention_impl": "blocks"}),
    Variant("attention=concat", policy={"attention_impl": "concat"}),
    Variant("attention=cudnn", policy={"attention_impl": "cudnn"}, gpu_only=True),
    Variant("unroll_loops", policy={"unroll_loops": True}),
    Variant("gpu_compiler_options", policy={"compiler_options": kernels.GPU_COMPILER_OPTIONS}, gpu_only=True),
    Variant("no_prompt_buckets", engine={"prompt_buckets": ()}),
)


class Clock:
    """Seconds left of the lab's budget."""

    def __init__(self, budget_s: float):
        self.deadline = time.monotonic() + budget_s

    def left(self) -> float:
        return self.deadline - time.monotonic()


def timed(fn: Callable[[], object], repeats: int) -> dict[str, float]:
    """Best and median ms of `repeats` calls after a warm one."""
    times = roofline.call_seconds(fn, repeats)
    return {"min_ms": min(times) * 1e3, "median_ms": statistics.median(times) * 1e3}


def profiled(fn: Callable[[], object], calls: int = 5) -> dict:
    """`calls` calls under the profiler, summarized (`trace.summarize`)."""
    jax.block_until_ready(fn())
    with tempfile.TemporaryDirectory() as log_dir:
        with jax.profiler.trace(log_dir, create_perfetto_trace=True):
            start = time.perf_counter()
            for _ in range(calls):
                jax.block_until_ready(fn())
            wall_s = time.perf_counter() - start
        events = trace.load_events(trace.find_trace(log_dir))
    return trace.summarize(events, calls, wall_s)


def model_config(name: str) -> pi05.Pi05Config:
    """The config's model in the backend's compute dtype (bf16 on GPU, f32 on CPU)."""
    config = config_lib.model_config(config_lib.get_config(name))
    return dataclasses.replace(config, dtype="float32" if jax.default_backend() == "cpu" else "bfloat16")


def live_params(params: dict, seed: int = 1, scale: float = 0.02) -> dict:
    """Random init leaves some matrices zero, as openpi's does (the adaRMS modulations, SigLIP's head):
    zero modulations switch the action expert's layers off, so the actions would not depend on the prefix
    and every variant would agree with the default trivially. Each all-zero matrix gets small random values
    instead; which leaves are zero is read in one device call."""
    leaves, tree = jax.tree.flatten(params)
    zero = jax.device_get(jax.jit(lambda xs: [~jnp.any(x) for x in xs])(leaves))
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    leaves = [
        scale * jax.random.normal(key, x.shape, x.dtype) if x.ndim >= 2 and is_zero else x
        for key, x, is_zero in zip(keys, leaves, zero, strict=True)
    ]
    return jax.tree.unflatten(tree, leaves)


def build_engine(params: dict, config: pi05.Pi05Config, variant: Variant | None = None) -> Engine:
    policy = kernels.for_backend()
    if variant is not None:
        policy = dataclasses.replace(policy, **variant.policy)
    return Engine(params, config, eos_id=-1, kernel_policy=policy, **(variant.engine if variant else {}))


def phase_calls(
    engine: Engine, obs: pi05.Observation, noise: jax.Array, num_steps: int
) -> dict[str, Callable]:
    """The frame's phases as calls that return device arrays (the caller waits for them)."""
    cameras = tuple(c for c in engine.config.image_keys if c not in engine.masked_cameras(obs))
    vision = jax.jit(pi05.embed_images, static_argnums=(1, 3))
    cache = engine.prefill(obs)
    calls = {
        "vision": lambda: vision(engine.params, engine.config, obs, cameras),
        "prefill": lambda: engine.prefill(obs),
        "denoise": lambda: engine.denoise(cache, noise, num_steps),
        "action_frame": lambda: np.asarray(engine.act(obs, noise, num_steps)[1]),
        "action_frame_two_programs": lambda: np.asarray(
            engine.denoise(engine.prefill(obs), noise, num_steps)
        ),
    }
    for batch in DECODE_BATCHES:
        calls[f"decode_step_b{batch}"] = _decode_call(engine, cache, batch, 1)
    decode_k = _decode_call(engine, cache, OXYGEN_SLOTS, OXYGEN_K)

    def oxygen_frame():
        """The actions, and k decode steps over full slots dispatched before they are pulled."""
        _, actions = engine.act(obs, noise, num_steps)
        state = decode_k()
        return np.asarray(actions), state

    calls["oxygen_frame"] = oxygen_frame
    return calls


def _decode_call(engine: Engine, cache: pi05.PrefixCache, batch: int, steps: int) -> Callable:
    """A call advancing a batch state of `batch` full greedy slots by `steps` tokens; slots are refilled
    before they run out, outside the timed call's work."""
    state = engine.init_state(batch, MAX_NEW, cache.mask.shape[1])
    inserts = [SlotInsert(slot, MAX_NEW, SamplingParams(seed=slot)) for slot in range(batch)]
    rows = engine.select_rows(cache, np.zeros(batch, np.int32))
    holder = {"state": engine.insert(state, rows, inserts), "steps": 0}

    def call():
        if holder["steps"] + steps > MAX_NEW:
            holder["state"], holder["steps"] = engine.insert(holder["state"], rows, inserts), 0
        holder["state"] = engine.decode(holder["state"], steps, sampling.GREEDY)
        holder["steps"] += steps
        return holder["state"].done

    return call


def floors(engine: Engine, obs: pi05.Observation, num_steps: int, peaks: dict) -> dict[str, dict]:
    """The roofline's floor of each phase it models, for this observation's cameras and prompt columns."""
    cameras = [c for c in engine.config.image_keys if c not in engine.masked_cameras(obs)]
    cache = engine.prefill(obs)
    prompt_len = cache.mask.shape[1] - len(cameras) * engine.config.image_tokens
    weights = roofline.weight_counts(engine.params)
    costs = roofline.phase_costs(
        engine.config, weights, len(cameras), num_steps, DECODE_BATCHES, MAX_NEW, prompt_len
    )
    out = {}
    for name, (flops, nbytes) in costs.items():
        floor_s, bound = roofline.floor(flops, nbytes, peaks)
        out[name] = {"floor_ms": floor_s * 1e3, "bound": bound}
    return out


def attention_shapes(config: pi05.Pi05Config, cameras: int) -> dict[str, tuple]:
    """(B, T, N, K, H, key lengths per block, valid keys) of the model's four attention calls."""
    g, v = config.paligemma, config.vision
    image, prompt, horizon = config.image_tokens, config.max_token_len, config.action_horizon
    prefix = cameras * image + prompt
    vision_heads = v.num_heads
    return {
        "vision": (cameras, image, vision_heads, vision_heads, v.width // vision_heads, (image,), image),
        "prefill": (1, prefix, g.num_heads, g.num_kv_heads, g.head_dim, (prefix,), prefix),
        "flow_step": (
            1,
            horizon,
            g.num_heads,
            g.num_kv_heads,
            g.head_dim,
            (prefix, horizon),
            prefix + horizon,
        ),
        "decode": (OXYGEN_SLOTS, 1, g.num_heads, g.num_kv_heads, g.head_dim, (prefix + MAX_NEW,), prefix + 8),
    }


def attention_bench(config: pi05.Pi05Config, cameras: int, repeats: int, clock: Clock) -> list[dict]:
    """Each attention implementation at the model's four shapes (all keys valid but a decode row's
    unwritten columns), and `jax.nn.dot_product_attention` over the same buffer for reference."""
    rows, dtype = [], jnp.dtype(config.dtype)
    impls = ["blocks", "concat"] + (["cudnn"] if jax.default_backend() == "gpu" else [])
    for shape_name, (b, t, n, k, h, blocks, valid) in attention_shapes(config, cameras).items():
        keys = jax.random.split(jax.random.key(0), 1 + 2 * len(blocks))
        q = jax.random.normal(keys[0], (b, t, n, h), dtype) * h**-0.5
        ks = [jax.random.normal(key, (b, s, k, h), dtype) for key, s in zip(keys[1::2], blocks, strict=True)]
        vs = [jax.random.normal(key, (b, s, k, h), dtype) for key, s in zip(keys[2::2], blocks, strict=True)]
        mask = jnp.broadcast_to(jnp.arange(sum(blocks)) < valid, (b, t, sum(blocks)))
        for impl in [*impls, "jax.nn.dot_product_attention"]:
            if clock.left() < 5:
                rows.append({"shape": shape_name, "impl": impl, "skipped": "no time left"})
                continue
            rows.append({"shape": shape_name, "impl": impl, "batch": b, "queries": t, "keys": sum(blocks)})
            rows[-1] |= timed(_attention_call(impl, q, ks, vs, mask), repeats)
    return rows


def _attention_call(impl: str, q, ks, vs, mask) -> Callable[[], jax.Array]:
    """One attention call: the kernel policy's `attention` with `impl`, or jax.nn's over one buffer."""
    if impl == "jax.nn.dot_product_attention":
        keys, values = (jnp.concatenate(x, axis=1) for x in (ks, vs))
        fn = jax.jit(lambda q, k, v, m: jax.nn.dot_product_attention(q, k, v, mask=m[:, None]))
        return lambda: fn(q, keys, values, mask)
    fn = jax.jit(dataclasses.replace(kernels.for_backend(), attention_impl=impl).attention)
    return lambda: fn(q, ks, vs, mask)


def run(config_name: str, repeats: int, clock: Clock, log: Callable[[str], None] = print) -> dict:
    """Every stage for one config; each stage is skipped (and says so) once the clock runs out."""
    config = model_config(config_name)
    layout = _LAYOUTS.get(config_name, "libero")
    obs = inputs.observation_from_arrays(observation(config, layout, 0), config)
    num_steps = 10
    params = jax.block_until_ready(
        live_params(pi05.init_params(config, jax.random.key(0), stacked=False, dtype=config.dtype))
    )
    engine = build_engine(params, config)
    noise = engine.noise(jax.random.key(1), 1)
    cameras = [c for c in config.image_keys if c not in engine.masked_cameras(obs)]
    cache = engine.prefill(obs)
    result = {
        "config": config_name,
        "dtype": config.dtype,
        "action_horizon": config.action_horizon,
        "num_steps": num_steps,
        "cameras": cameras,
        "prompt_columns": int(cache.mask.shape[1]) - len(cameras) * config.image_tokens,
        "prompt_tokens": int(np.asarray(obs.tokenized_prompt_mask).sum()),
    }
    peaks = roofline.machine(config.dtype)
    result["machine"] = peaks
    phase_floor = floors(engine, obs, num_steps, peaks)
    phases = {}
    for name, call in phase_calls(engine, obs, noise, num_steps).items():
        if clock.left() < 30:  # a phase's compilation and repeats
            phases[name] = {"skipped": "no time left"}
            continue
        start = time.monotonic()
        phases[name] = timed(call, repeats) | phase_floor.get(name, {})
        if "floor_ms" in phases[name]:
            phases[name]["x_floor"] = phases[name]["min_ms"] / phases[name]["floor_ms"]
        phases[name]["profile"] = profiled(call)
        log(f"{config_name} {name}: {phases[name]['min_ms']:.2f} ms ({time.monotonic() - start:.0f} s)")
    result["phases"] = phases
    reference = np.asarray(engine.act(obs, noise, num_steps)[1], np.float32)
    frame = Frame(obs, noise, num_steps, reference)
    result["variants"] = [_variant(v, params, config, frame, repeats, clock, log) for v in VARIANTS]
    del engine
    result["attention"] = attention_bench(config, len(cameras), repeats, clock)
    return result


@dataclasses.dataclass(frozen=True)
class Frame:
    """One frame's inputs, and the default engine's actions for them."""

    obs: pi05.Observation
    noise: jax.Array
    num_steps: int
    reference: np.ndarray


def _variant(variant: Variant, params, config, frame: Frame, repeats: int, clock: Clock, log) -> dict:
    """The variant's denoise, prefill and action frame, and its actions against the default's."""
    obs, noise, num_steps, reference = frame.obs, frame.noise, frame.num_steps, frame.reference
    out = {"name": variant.name}
    policy_fields = {f.name for f in dataclasses.fields(kernels.KernelPolicy)}
    if variant.gpu_only and jax.default_backend() != "gpu":
        return out | {"skipped": "GPU only"}
    if not set(variant.policy) <= policy_fields:
        return out | {"skipped": "unavailable in this engine"}
    if clock.left() < 30:
        return out | {"skipped": "no time left"}
    start = time.monotonic()
    try:
        engine = build_engine(params, config, variant)
        actions = np.asarray(engine.act(obs, noise, num_steps)[1], np.float32)
        cache = engine.prefill(obs)
        out |= {
            "prefill": timed(lambda: engine.prefill(obs), repeats),
            "denoise": timed(lambda: engine.denoise(cache, noise, num_steps), repeats),
            "action_frame": timed(lambda: np.asarray(engine.act(obs, noise, num_steps)[1]), repeats),
            "max_abs_diff": float(np.abs(actions - reference).max()),
            "max_rel_diff": float(np.abs(actions - reference).max() / max(np.abs(reference).max(), 1e-12)),
        }
    except Exception as error:  # a variant the backend refuses (e.g. cuDNN's shapes) is reported, not fatal
        out["error"] = f"{type(error).__name__}: {str(error).splitlines()[0][:300]}"
    log(f"variant {variant.name}: {time.monotonic() - start:.0f} s")
    return out
