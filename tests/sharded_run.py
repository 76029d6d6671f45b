"""Runs the tiny golden model unsharded and on a mesh in one process; writes both results to an npz.

Run by tests/test_mesh.py in a subprocess with XLA_FLAGS=--xla_force_host_platform_device_count=4
(JAX reads the flag at import, so the test process itself keeps one device).
Usage: python tests/sharded_run.py <out.npz> <mesh>...
"""

import sys

import jax
import numpy as np
from conftest import GOLDEN, golden_inputs

from oxygen_jax import checkpoints, config
from oxygen_jax.engine import mesh as mesh_lib
from oxygen_jax.engine import sampling
from oxygen_jax.engine.api import ChunkGuidance, SlotInsert
from oxygen_jax.engine.compile_counter import CompileCounter
from oxygen_jax.engine.engine import Engine
from oxygen_jax.models import inputs
from oxygen_jax.runtime.k_policy import FixedK
from oxygen_jax.runtime.manager import KVCacheManager
from oxygen_jax.runtime.requests import TextRequest
from oxygen_jax.runtime.scheduler import FrameInput, FrameScheduler

ROWS = 4
TEXT = 6


def spec(array: jax.Array) -> str:
    return str(tuple(getattr(array.sharding, "spec", ("single device",))))


def engine_outputs(engine: Engine, obs, noise) -> dict:
    """Prefix K, actions (plain and guided), greedy text alone and through σ̂ (insert + decode), σ̂'s
    layout."""
    cache = engine.prefill(obs)
    actions = engine.denoise(cache, noise, num_steps=10)
    guided = engine.denoise(cache, noise, num_steps=10, guidance=guidance_rows(noise))
    text = engine.generate(cache, TEXT)
    sampled = engine.generate(cache, TEXT, temperature=1.0, seed=3)
    state = engine.init_state(ROWS, TEXT, cache.mask.shape[1])
    state = engine.insert(state, cache, [SlotInsert(slot=i, max_new_tokens=TEXT) for i in range(ROWS)])
    state = engine.decode(state, TEXT, sampling.GREEDY)
    return {
        "k": cache.k,
        "actions": actions,
        "guided_actions": guided,
        "text": text.tokens,
        "text_logprobs": text.logprobs,
        "sampled_text": sampled.tokens,
        "state_tokens": state.tokens,
        "state_k_spec": spec(state.k[0]),
        "state_tokens_spec": spec(state.tokens),
        "state_keys_spec": spec(state.keys),
        "cache_k_spec": spec(cache.k),
        "q_spec": spec(_q_weight(engine.params["PaliGemma"]["llm"]["layers_0"]["attn"])),
    }


def _q_weight(attn: dict) -> jax.Array:
    """Expert 0's q weight; on one device the engine fuses q, k and v into `qkv_einsum`."""
    return attn["q_einsum"]["w"] if "q_einsum" in attn else attn["qkv_einsum"]["w"]


def guidance_rows(noise: np.ndarray) -> list[ChunkGuidance | None]:
    """Real-time chunking on 3 of the 4 rows (different delays, horizons, schedules and betas), one plain."""
    prev = np.random.default_rng(1).standard_normal(noise.shape, np.float32)
    return [
        ChunkGuidance(prev[0], delay=2, horizon=6),
        None,
        ChunkGuidance(prev[2], delay=4, horizon=8, schedule="linear", max_guidance_weight=1.0),
        ChunkGuidance(prev[3], delay=1, horizon=10, schedule="ones", max_guidance_weight=3.0),
    ]


def served(engine: Engine, rows: list[dict], noise: np.ndarray) -> dict:
    """The frame loop after warm-up: 3 frames of 3 robots, each asking for text; compilations counted."""
    manager = KVCacheManager(engine, max_slots=ROWS, max_new_tokens=TEXT)
    scheduler = FrameScheduler(engine, manager, FixedK(2), num_steps=10, max_prefill_batch=ROWS)
    scheduler.warmup(rows[0])
    texts, actions = {}, []
    with CompileCounter() as compiles:
        for frame in range(3):
            frame_inputs = [
                FrameInput(rows[r], noise[r : r + 1], [TextRequest(10 * frame + r, max_new_tokens=TEXT)])
                for r in range(3)
            ]
            result = scheduler.step(frame_inputs)
            actions.append(np.stack(result.actions))
            texts.update({t.request_id: t.tokens for t in result.finished})
        while manager.active or manager.queued:
            texts.update({t.request_id: t.tokens for t in scheduler.step([]).finished})
    return {
        "admitted_loads": admitted_loads(engine, manager, rows[0]),
        "served_actions": np.stack(actions),
        "served_text": np.stack([texts[i] for i in sorted(texts)]),
        "served_compiles": compiles.count,
    }


def admitted_loads(engine: Engine, manager: KVCacheManager, row: dict) -> np.ndarray:
    """Occupied slots per data shard after admitting 1, then 2 more, then 1 more request (empty manager)."""
    cache = engine.prefill(inputs.observation_from_arrays(row, engine.config))
    loads = []
    for request_ids in ([100], [101, 102], [103]):
        for request_id in request_ids:
            manager.submit(TextRequest(request_id, max_new_tokens=TEXT), cache, 0, frame=0)
        manager.admit(frame=0)
        loads.append(manager.shard_load())
    for request_id in range(100, 104):
        manager.cancel(request_id)
    return np.array(loads)


def main(out: str, *mesh_specs: str) -> None:
    cfg = config.model_config(config.load_config("pi05_tiny"))
    params = checkpoints.restore_params(GOLDEN / "checkpoint")
    golden = golden_inputs(np.load(GOLDEN / "model_io.npz"))
    batch = len(golden["tokenized_prompt"])
    rows = [{k: v[r % batch : r % batch + 1] for k, v in golden.items()} for r in range(ROWS)]
    obs = inputs.observation_from_arrays({k: np.concatenate([r[k] for r in rows]) for k in golden}, cfg)
    noise = np.random.default_rng(0).standard_normal((ROWS, cfg.action_horizon, cfg.action_dim), np.float32)
    results = {}
    for name in ("single", *mesh_specs):
        engine = Engine(params, cfg, mesh=mesh_lib.mesh_from_spec(None if name == "single" else name))
        outputs = engine_outputs(engine, obs, noise)
        if name != "single":  # served frames are compared with the single-device engine outputs
            outputs |= served(engine, rows, noise)
        results |= {f"{name}/{key}": np.asarray(value) for key, value in outputs.items()}
    np.savez(out, **results)


if __name__ == "__main__":
    main(*sys.argv[1:])
