"""The decode batch state σ̂ and its pure entry points: init, insert, decode(k), evict.

One row ("slot") per in-flight language request; capacity S slots x C = P + N columns, where P is the
prefix length and N the most tokens a request may generate. Every shape is fixed by (S, P, N), so
steady-state frames never recompile, whatever the number of active requests. A slot holds a copy of its
frame's prefix K/V, so requests from different frames decode together in one batch.

Each decode step samples the next token from the slot's last hidden state, records it, and (unless the
request just finished) feeds it through the backbone, appending its K/V at column `write_idx`. A decode
takes its step count and sampling mode as static values: its loop has a constant trip count and no
branch, so XLA:GPU never copies a loop predicate or a condition to the host between steps.
"""

import functools

import flax.struct
import jax
import jax.numpy as jnp

from oxygen_jax.engine import sampling
from oxygen_jax.models import pi05


@flax.struct.dataclass
class BatchState:
    """k, v: per layer [S, C, K, H] (one buffer a layer, updated in place); kv_valid: [S, C]; hidden:
    [S, D] (last hidden, next token's source); next_pos / write_idx: [S] RoPE position and cache column
    of the next fed token; tokens / logprobs: [S, N] output buffer (log-probability under the
    temperature-1 softmax); n_generated, max_new: [S]; done, active: [S]; keys: [S] PRNG keys;
    temperature, top_p: [S]."""

    k: tuple[jax.Array, ...]
    v: tuple[jax.Array, ...]
    kv_valid: jax.Array
    hidden: jax.Array
    next_pos: jax.Array
    write_idx: jax.Array
    tokens: jax.Array
    logprobs: jax.Array
    n_generated: jax.Array
    max_new: jax.Array
    done: jax.Array
    active: jax.Array
    keys: jax.Array
    temperature: jax.Array
    top_p: jax.Array

    @property
    def max_slots(self) -> int:
        return self.kv_valid.shape[0]

    @property
    def max_new_tokens(self) -> int:
        return self.tokens.shape[1]


def init_state(
    config: pi05.Pi05Config, max_slots: int, max_new_tokens: int, prefix_len: int | None = None
) -> BatchState:
    """An empty state for `max_slots` requests of up to `max_new_tokens` tokens each, on prefixes of up
    to `prefix_len` columns (default: every camera slot + the prompt)."""
    g = config.paligemma
    columns = (prefix_len or config.prefix_len) + max_new_tokens
    s = max_slots
    kv_shape = (s, columns, g.num_kv_heads, g.head_dim)
    return BatchState(
        k=tuple(jnp.zeros(kv_shape, config.dtype) for _ in range(g.depth)),
        v=tuple(jnp.zeros(kv_shape, config.dtype) for _ in range(g.depth)),
        kv_valid=jnp.zeros((s, columns), bool),
        hidden=jnp.zeros((s, g.width), config.dtype),
        next_pos=jnp.zeros(s, jnp.int32),
        write_idx=jnp.zeros(s, jnp.int32),
        tokens=jnp.zeros((s, max_new_tokens), jnp.int32),
        logprobs=jnp.zeros((s, max_new_tokens), jnp.float32),
        n_generated=jnp.zeros(s, jnp.int32),
        max_new=jnp.zeros(s, jnp.int32),
        done=jnp.zeros(s, bool),
        active=jnp.zeros(s, bool),
        keys=jax.random.split(jax.random.key(0), s),
        temperature=jnp.zeros(s, jnp.float32),
        top_p=jnp.ones(s, jnp.float32),
    )


def state_bytes(state: BatchState) -> int:
    """Device bytes held by the state (the memory cost of continuous batching)."""
    leaves = jax.tree.leaves(state.replace(keys=jax.random.key_data(state.keys)))
    return sum(x.size * x.dtype.itemsize for x in leaves)


def insert(
    state: BatchState,
    cache: pi05.PrefixCache,
    slots: jax.Array,
    max_new: jax.Array,
    temperature: jax.Array,
    top_p: jax.Array,
    seeds: jax.Array,
    rows: jax.Array | None = None,
) -> BatchState:
    """Puts prefix rows [B] into slots [B]; a slot index outside [0, S) skips that row (batch padding).

    max_new, temperature, top_p: [B]; seeds: [B] integer seeds of each request's sampling stream; rows:
    [B] rows of `cache` to insert, gathered in the same program (None: every row, in order).
    """
    if rows is not None:
        cache = select_rows(cache, rows)
    prefix_len = cache.mask.shape[1]
    drop = {"mode": "drop"}

    def put(buf, value):
        return buf.at[slots].set(value, **drop)

    def put_prefix(bufs, value):  # per layer [S, C, K, H] <- [depth, B, P, K, H]
        return tuple(
            b.at[slots, :prefix_len].set(x.astype(b.dtype), **drop) for b, x in zip(bufs, value, strict=True)
        )

    valid = jnp.zeros((slots.shape[0], state.kv_valid.shape[1]), bool).at[:, :prefix_len].set(cache.mask)
    return state.replace(
        k=put_prefix(state.k, cache.k),
        v=put_prefix(state.v, cache.v),
        kv_valid=put(state.kv_valid, valid),
        hidden=put(state.hidden, cache.last_hidden.astype(state.hidden.dtype)),
        next_pos=put(state.next_pos, cache.length.astype(jnp.int32)),
        write_idx=put(state.write_idx, jnp.full(slots.shape, prefix_len, jnp.int32)),
        tokens=put(state.tokens, jnp.zeros((slots.shape[0], state.max_new_tokens), jnp.int32)),
        logprobs=put(state.logprobs, jnp.zeros((slots.shape[0], state.max_new_tokens), jnp.float32)),
        n_generated=put(state.n_generated, jnp.zeros(slots.shape, jnp.int32)),
        max_new=put(state.max_new, jnp.clip(max_new, 1, state.max_new_tokens).astype(jnp.int32)),
        done=put(state.done, jnp.zeros(slots.shape, bool)),
        active=put(state.active, jnp.ones(slots.shape, bool)),
        keys=put(state.keys, jax.vmap(jax.random.key)(seeds)),
        temperature=put(state.temperature, temperature.astype(jnp.float32)),
        top_p=put(state.top_p, top_p.astype(jnp.float32)),
    )


def select_rows(cache: pi05.PrefixCache, rows: jax.Array) -> pi05.PrefixCache:
    """Rows [n] of a prefix cache (traced indices: one compilation per shape, not per row)."""
    return cache.replace(
        k=jnp.take(cache.k, rows, axis=1),
        v=jnp.take(cache.v, rows, axis=1),
        mask=cache.mask[rows],
        positions=cache.positions[rows],
        length=cache.length[rows],
        last_hidden=cache.last_hidden[rows],
    )


def evict(state: BatchState, slots: jax.Array) -> BatchState:
    """Frees slots [n] (indices outside [0, S) are ignored): they stop decoding and may be reused."""
    return state.replace(
        active=state.active.at[slots].set(False, mode="drop"),
        done=state.done.at[slots].set(False, mode="drop"),
        kv_valid=state.kv_valid.at[slots].set(False, mode="drop"),
    )


def _decode_step(
    params: dict, config: pi05.Pi05Config, eos_id: int, mode: sampling.SamplingMode, state: BatchState
) -> BatchState:
    rows = jnp.arange(state.max_slots)
    live = state.active & ~state.done
    logits = pi05.text_logits(params, config, state.hidden)
    split = jax.vmap(jax.random.split)(state.keys)
    token = sampling.sample_tokens(logits, split[:, 1], state.temperature, state.top_p, mode)
    logprob = jnp.take_along_axis(jax.nn.log_softmax(logits, axis=-1), token[:, None], axis=-1)[:, 0]

    out_col = jnp.where(live, state.n_generated, state.max_new_tokens)  # out of range: not written
    n_generated = state.n_generated + live
    finished = live & ((token == eos_id) | (n_generated >= state.max_new))
    feed = live & ~finished

    # The fed token's K/V go straight into the state buffers (column write_idx), then attention reads them.
    write_col = jnp.where(feed, state.write_idx, state.kv_valid.shape[1])  # out of range: not written
    kv_valid = state.kv_valid.at[rows, write_col].set(True, mode="drop")
    hidden, (k, v) = pi05.text_forward(
        params, config, token[:, None], state.next_pos[:, None], (state.k, state.v), kv_valid, write_col
    )
    return state.replace(
        k=tuple(k),
        v=tuple(v),
        kv_valid=kv_valid,
        hidden=jnp.where(feed[:, None], hidden[:, 0], state.hidden),
        next_pos=state.next_pos + feed,
        write_idx=state.write_idx + feed,
        tokens=state.tokens.at[rows, out_col].set(token, mode="drop"),
        logprobs=state.logprobs.at[rows, out_col].set(logprob, mode="drop"),
        n_generated=n_generated,
        done=state.done | finished,
        keys=jnp.where(live, split[:, 0], state.keys),
    )


def decode(
    params: dict,
    config: pi05.Pi05Config,
    state: BatchState,
    num_steps: int,
    eos_id: int = 1,
    *,
    mode: sampling.SamplingMode,
) -> BatchState:
    """Advances every active, unfinished slot by up to `num_steps` tokens (static: one program per count).

    mode: the sampling paths the occupied slots need (`SamplingMode.of` their temperatures and top-p).
    """
    step = functools.partial(_decode_step, params, config, eos_id, mode)
    return jax.lax.fori_loop(0, num_steps, lambda _, s: step(s), state)


def step_chunks(num_steps: int) -> list[int]:
    """`num_steps` as the decode programs that run it: its binary digits, largest first (10 -> [8, 2]),
    so every count up to N runs on the log2(N) + 1 programs of `compiled_steps(N)`."""
    return [1 << bit for bit in reversed(range(num_steps.bit_length())) if num_steps >> bit & 1]


def compiled_steps(max_steps: int) -> list[int]:
    """The step counts of the decode programs any count up to `max_steps` runs on."""
    return [1 << bit for bit in range(max(max_steps, 0).bit_length())]
