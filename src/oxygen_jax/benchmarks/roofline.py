"""Roofline: each phase's measured time against its compute- or bandwidth-bound floor on this machine.

FLOPs and bytes are counted from the model config (matmul weights touched per token, attention over
the columns actually computed, weights and KV read once per call). The machine's matmul throughput and
memory bandwidth are measured in the same process. The cost model turns the measured phase times into
the frame time of each mode, and so into a bound on oxygen's speedup over isolated.
"""

import functools
import pathlib
import platform
import re
import time

import jax
import jax.numpy as jnp
import numpy as np

from oxygen_jax.benchmarks.spec import RunSpec, observation
from oxygen_jax.engine import sampling
from oxygen_jax.engine.api import SamplingParams, SlotInsert
from oxygen_jax.engine.engine import Engine
from oxygen_jax.models import gemma, inputs, pi05
from oxygen_jax.models.pi05 import Pi05Config


def call_seconds(fn, reps: int) -> list[float]:
    """Seconds of each of `reps` calls after a warm one (a call ends when its output is ready)."""
    jax.block_until_ready(fn())
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - start)
    return times


def _best_s(fn, reps: int = 7) -> float:
    """Fastest of `reps` calls after a warm one: on a shared machine, the least disturbed repeat."""
    return min(call_seconds(fn, reps))


def _backbone_mlps(engine: Engine) -> list[dict]:
    """Each backbone layer's MLP params (the engine holds its layers as per-layer trees)."""
    llm = engine.params["PaliGemma"]["llm"]
    return [llm[gemma.layer_name(i)]["mlp"] for i in range(engine.config.paligemma.depth)]


def mlp_stream(engine: Engine, batches: tuple[int, ...]) -> dict[str, float]:
    """Bytes/s at which the backend's dot kernels stream this model's MLP weights at each decode batch b:
    every backbone layer's gated MLP (the model's own code, two thirds of a decode step's bytes) as a
    chain on [b, D] inputs, nothing else. A decode step cannot stream its weights faster than this, so
    it is the floor the kernels set (on XLA:CPU, b = 1 runs GEMVs and b > 1 GEMMs)."""
    g = engine.config.paligemma
    ffn = gemma.FeedForward(g.width, g.mlp_dim, engine.config.kernels)
    mlps = _backbone_mlps(engine)

    @functools.partial(jax.jit, compiler_options=dict(engine.config.kernels.decode_options))  # as decode
    def chain(x, mlps):
        for mlp in mlps:
            x = x + ffn.apply({"params": mlp}, x)
        return x

    nbytes = sum(w.nbytes for w in jax.tree.leaves(mlps))
    rates = {}
    for b in batches:
        x = jnp.ones((b, g.width), engine.config.dtype)
        rates[f"b{b}"] = nbytes / _best_s(lambda x=x: chain(x, mlps), reps=25)
    return rates


def blas_stream(engine: Engine, batches: tuple[int, ...]) -> dict[str, float]:
    """The rate `mlp_stream`'s matmuls reach in numpy's BLAS (CPU only): the same weights, shapes and
    order without the activations. It tells whether a slow batch-b decode step is the engine's doing
    or the machine's small-M GEMMs."""
    mlps = _backbone_mlps(engine)
    weights = [
        w
        for mlp in mlps
        for w in (*np.asarray(mlp["gating_einsum"], np.float32), np.asarray(mlp["linear"], np.float32))
    ]
    nbytes = sum(w.nbytes for w in weights)
    rates = {}
    for b in batches:
        xs = {n: np.ones((b, n), np.float32) for n in {w.shape[0] for w in weights}}
        rates[f"b{b}"] = nbytes / _best_s(lambda xs=xs: [xs[w.shape[0]] @ w for w in weights], reps=25)
    return rates


def blas_name() -> str:
    """The BLAS numpy was built with (e.g. scipy-openblas)."""
    return np.show_config(mode="dicts")["Build Dependencies"]["blas"]["name"]


def processor() -> str:
    """The CPU's model name and widest vector ISA (results differ between, e.g., AVX2 and AVX-512 parts)."""
    try:
        text = pathlib.Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine()
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    fields = {k.strip(): v.strip() for k, v in fields.items()}
    flags = set(fields.get("flags", "").split())
    isa = next((f for f in ("avx512f", "avx2", "neon", "asimd") if f in flags), "")
    family = f"family {fields['cpu family']} model {fields['model']}" if "cpu family" in fields else ""
    return ", ".join(x for x in (fields.get("model name", platform.machine()), family, isa) if x)


def machine(dtype: str) -> dict[str, float]:
    """Best matmul FLOP/s in the compute dtype and best memory bandwidth (read-only and copy kernels)."""
    cpu = jax.default_backend() == "cpu"
    n, size = (2048, 2**26) if cpu else (8192, 2**29)
    a = jnp.ones((n, n), dtype)
    matmul = jax.jit(jnp.dot)
    matmul_s = _best_s(lambda: matmul(a, a))
    x = jnp.ones(size, jnp.float32)
    read, copy = jax.jit(jnp.sum), jax.jit(lambda x: x * 2)
    read_s = _best_s(lambda: read(x))
    copy_s = _best_s(lambda: copy(x))
    return {
        "matmul_flops_per_s": 2 * n**3 / matmul_s,
        "bandwidth_bytes_per_s": max(x.nbytes / read_s, 2 * x.nbytes / copy_s),
        "matmul_n": n,
        "bandwidth_array_bytes": x.nbytes,
    }


_LAYER = re.compile(r"^(layers|encoderblock)(_\d+)?$")  # a layer's tree: its index is no expert
_EXPERT = re.compile(r"^(?!Dense_|LayerNorm_)\w+_(\d+)$")  # openpi's expert suffix: `mlp_1`, `qkv_einsum_1`


def _expert(parts: list[str]) -> int:
    """The expert a language-model weight belongs to, from its module names (`mlp_1` -> 1)."""
    for part in parts:
        match = None if _LAYER.match(part) else _EXPERT.match(part)
        if match:
            return int(match.group(1))
    return 0


def weight_counts(params: dict) -> dict[str, int]:
    """Matmul weights per group, in any of the model's param layouts (openpi's stacked tree, the runtime
    layout, the engine's fused q/k/v):

    vision (SigLIP and its head), backbone (expert 0's layers), action_expert (what every flow step
    reads: expert 1's layers and the action in/out projections), conditioning (the time MLP and every
    adaRMS modulation of expert 1, computed once per denoise call for all steps), embedding (the table,
    also the language head). Biases, norm scales and the position embedding are not matmul weights.
    """
    counts = dict.fromkeys(("vision", "backbone", "action_expert", "conditioning", "embedding"), 0)
    for path, x in jax.tree_util.tree_flatten_with_path(params)[0]:
        parts = jax.tree_util.keystr(path, simple=True, separator="/").split("/")
        if parts[-1] in ("bias", "scale", "pos_embedding"):
            continue
        if parts[:2] == ["PaliGemma", "img"]:
            group = "vision"
        elif parts[:3] == ["PaliGemma", "llm", "embedder"]:
            group = "embedding"
        elif parts[:2] == ["PaliGemma", "llm"]:
            expert = _expert(parts[2:])
            if any("norm" in part for part in parts):  # only expert 1's adaRMS norms hold a matmul
                group = "conditioning"
            else:
                group = "action_expert" if expert else "backbone"
        else:  # action in/out projections (per step) and the time MLP (once per call)
            group = "conditioning" if parts[0].startswith("time_mlp") else "action_expert"
        counts[group] += x.size
    return counts


def phase_costs(
    config: Pi05Config,
    weights: dict[str, int],
    cameras: int,
    num_steps: int,
    batches: tuple[int, ...],
    max_new: int,
    prompt_len: int | None = None,
) -> dict[str, tuple[float, float]]:
    """(FLOPs, bytes) per phase at batch 1. `cameras`: cameras the prefill computes; `prompt_len`: the
    prompt columns it computes (default: the config's max_token_len); decode attends the batch state's
    columns (that prefix plus max_new). The denoise reads its per-step weights and the prefix cache every
    step, the conditioning weights once per call."""
    item = jnp.dtype(config.dtype).itemsize
    g, e, v = config.paligemma, config.action_expert, config.vision
    kv_col = 2 * g.depth * g.num_kv_heads * g.head_dim * item  # K and V bytes of one cache column
    image_tokens = config.image_tokens
    vision_flops = cameras * (2 * image_tokens * weights["vision"] + 4 * image_tokens**2 * v.width * v.depth)
    vision_bytes = weights["vision"] * item
    prefix = cameras * image_tokens + (config.max_token_len if prompt_len is None else prompt_len)
    attn_width = g.num_heads * g.head_dim
    prefill_flops = vision_flops + 2 * prefix * weights["backbone"] + 4 * prefix**2 * attn_width * g.depth
    horizon = config.action_horizon
    step_flops = (
        2 * horizon * weights["action_expert"] + 4 * horizon * (prefix + horizon) * attn_width * e.depth
    )
    denoise_flops = num_steps * (step_flops + 2 * weights["conditioning"])
    denoise_bytes = (
        num_steps * (weights["action_expert"] * item + prefix * kv_col) + weights["conditioning"] * item
    )
    costs = {
        "vision": (vision_flops, vision_bytes),
        "prefill": (prefill_flops, vision_bytes + weights["backbone"] * item + prefix * kv_col),
        "denoise": (denoise_flops, denoise_bytes),
    }
    columns = prefix + max_new
    decoder = weights["backbone"] + weights["embedding"]
    for b in batches:
        flops = b * (2 * decoder + 4 * columns * attn_width * g.depth)
        costs[f"decode_step_b{b}"] = (flops, decoder * item + b * columns * kv_col)
    return costs


def _decode_step_s(engine: Engine, cache, batch: int, max_new: int, steps: int = 16) -> float:
    """Seconds per token step of decode(k=steps) on a batch state of `batch` full slots, sized to the
    cache's prefix as the scheduler sizes it."""
    state = engine.init_state(batch, max_new, cache.mask.shape[1])
    rows = engine.select_rows(cache, np.zeros(batch, np.int32))
    inserts = [SlotInsert(slot, max_new, SamplingParams(seed=slot)) for slot in range(batch)]
    holder = [engine.insert(state, rows, inserts)]

    def call():
        holder[0] = engine.decode(holder[0], steps, sampling.GREEDY)
        return holder[0].done

    return _best_s(call, reps=25) / steps  # short calls: more repeats find an undisturbed one


def floor(flops: float, nbytes: float, peaks: dict[str, float]) -> tuple[float, str]:
    """Seconds a phase needs at least at `peaks` (matmul FLOP/s, memory bytes/s), and which one bounds it."""
    compute_s = flops / peaks["matmul_flops_per_s"]
    memory_s = nbytes / peaks["bandwidth_bytes_per_s"]
    return max(compute_s, memory_s), "compute" if compute_s >= memory_s else "bandwidth"


def measure(engine: Engine, spec: RunSpec) -> dict:
    """Machine peaks, per-phase times vs floors, and the cost model of the spec's setting (rate 1)."""
    config = engine.config
    arrays = observation(config, spec.layout, 0)
    obs = inputs.observation_from_arrays(arrays, config)
    cams = tuple(c for c in config.image_keys if c not in engine.masked_cameras(obs))
    vision = jax.jit(pi05.embed_images, static_argnums=(1, 3))  # the image part of the engine's prefill
    cache = engine.prefill(obs)
    noise = engine.noise(jax.random.key(0), 1)
    batches = tuple(sorted({1, 4, spec.slots}))
    seconds = {
        "vision": _best_s(lambda: vision(engine.params, config, obs, cams)),
        "prefill": _best_s(lambda: engine.prefill(obs)),
        "denoise": _best_s(lambda: engine.denoise(cache, noise, spec.num_steps)),
        **{f"decode_step_b{b}": _decode_step_s(engine, cache, b, spec.max_new) for b in batches},
        "generate_b1": _best_s(lambda: engine.generate(cache, spec.max_new).tokens, 3),
        "decode_k_b1": spec.k * _decode_step_s(engine, cache, 1, spec.max_new, spec.k),
        "decode_k_slots": spec.k * _decode_step_s(engine, cache, spec.slots, spec.max_new, spec.k),
    }
    peaks = machine(config.dtype)
    stream = mlp_stream(engine, batches)
    prompt_len = cache.mask.shape[1] - len(cams) * config.image_tokens  # the prompt columns that ran
    weights = weight_counts(engine.params)
    costs = phase_costs(config, weights, len(cams), spec.num_steps, batches, spec.max_new, prompt_len)
    phases = []
    for name, (flops, nbytes) in costs.items():
        floor_s, bound = floor(flops, nbytes, peaks)
        phases.append(
            {
                "phase": name,
                "ms": seconds[name] * 1e3,
                "flops": flops,
                "bytes": nbytes,
                "floor_ms": floor_s * 1e3,
                "bound": bound,
                "x_floor": seconds[name] / floor_s,
            }
        )
        if name.startswith("decode_step_b"):  # the same bytes at the dot kernels' streaming rate
            stream_s = nbytes / stream[name.removeprefix("decode_step_")]
            phases[-1] |= {"stream_floor_ms": stream_s * 1e3, "x_stream_floor": seconds[name] / stream_s}
    cpu = jax.default_backend() == "cpu"
    blas = {"blas": blas_name(), "blas_stream_bytes_per_s": blas_stream(engine, batches)} if cpu else {}
    return {
        "processor": processor(),
        "setting": {
            "action_horizon": config.action_horizon,
            "num_steps": spec.num_steps,
            "cameras": list(cams),
            "prompt_len": prompt_len,
            "prefix_len": int(cache.mask.shape[1]),
            "weights": weights,
        },
        "machine": peaks,
        "mlp_stream_bytes_per_s": stream,
        **blas,
        "phases": phases,
        "phase_ms": {k: s * 1e3 for k, s in seconds.items()},
        "cost_model": cost_model(seconds, spec),
    }


def cost_model(seconds: dict[str, float], spec: RunSpec) -> dict[str, float]:
    """Frame times of each mode at one request per frame, from measured phases.

    isolated = 2 prefill + denoise + generate(N); shared_kv = one prefill less; oxygen = prefill +
    denoise + decode(k) on the batch state's slots; perfect batching = the same at the cost of one slot.
    """
    act = seconds["prefill"] + seconds["denoise"]
    frame = {
        "action_only": act,
        "isolated": act + seconds["prefill"] + seconds["generate_b1"],
        "shared_kv": act + seconds["generate_b1"],
        "oxygen": act + seconds["decode_k_slots"],
        "batching_upper_bound": act + seconds["decode_k_b1"],
    }
    out = {f"{mode}_frame_ms": s * 1e3 for mode, s in frame.items()}
    out["speedup_bound"] = frame["isolated"] / frame["oxygen"]
    out["batching_upper_bound_speedup"] = frame["isolated"] / frame["batching_upper_bound"]
    out["oxygen_hz_fraction_of_action_only"] = frame["action_only"] / frame["oxygen"]
    return out
