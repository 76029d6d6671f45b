"""A fake engine: the runtime's engine contract (`api.RuntimeEngine`) with outputs computable by hand.

No model runs; every call is a few numpy operations, so tests of the KV cache manager and the schedulers
take milliseconds. What it computes:
- prefill: a prefix of the prompt columns only (no image tokens); a row's `length` is its number of
  valid prompt tokens.
- denoise: actions = noise + num_steps; a guided row's first `delay` actions are its previous chunk's
  (recorded as "guided_denoise" when any row is guided, the engine's guided program).
- decode: a slot on a prefix of length L emits the tokens L, L + 1, L + 2, ... with log-probability
  -1 each, until it emits `eos_id` or its max_new_tokens.
`calls` records each call by name (with its batch size or step count), so tests can see how the runtime
drives the engine.
"""

import dataclasses
from collections.abc import Sequence

import jax
import numpy as np

from oxygen_jax.engine import api
from oxygen_jax.engine.batch_state import BatchState
from oxygen_jax.engine.sampling import SamplingMode
from oxygen_jax.models.pi05 import Observation, Pi05Config, PrefixCache


class FakeEngine:
    def __init__(self, config: Pi05Config, eos_id: int = -1):
        self.config = config
        self.eos_id = eos_id
        self.data_size = 1
        self.prompt_buckets = ()  # prefill reads the prompt columns as given
        self.calls: list[tuple[str, int]] = []

    def prefill(self, obs: Observation) -> PrefixCache:
        mask = np.asarray(obs.tokenized_prompt_mask, bool)
        self.calls.append(("prefill", mask.shape[0]))
        batch, columns = mask.shape
        empty_kv = np.zeros((0, batch, columns, 0, 0), np.float32)
        return PrefixCache(
            k=empty_kv,
            v=empty_kv,
            mask=mask,
            positions=np.cumsum(mask, axis=1) - 1,
            length=mask.sum(axis=1),
            last_hidden=np.zeros((batch, 0), np.float32),
        )

    def to_host(self, tree):
        return jax.device_get(tree)

    def prefix_len(self, obs: Observation) -> int:
        return np.asarray(obs.tokenized_prompt_mask).shape[1]

    def denoise(
        self,
        cache: PrefixCache,
        noise: jax.Array,
        num_steps: int = 10,
        guidance: Sequence[api.ChunkGuidance | None] = (),
    ) -> np.ndarray:
        guided = any(row is not None for row in guidance)
        self.calls.append(("guided_denoise" if guided else "denoise", cache.mask.shape[0]))
        actions = np.asarray(noise, np.float32) + num_steps
        for row, guided in enumerate(guidance):
            if guided is not None:
                actions[row, : guided.delay] = guided.prev_chunk[: guided.delay]
        return actions

    def act(
        self,
        obs: Observation,
        noise: jax.Array,
        num_steps: int = 10,
        guidance: Sequence[api.ChunkGuidance | None] = (),
    ) -> tuple[PrefixCache, np.ndarray]:
        cache = self.prefill(obs)
        return cache, self.denoise(cache, noise, num_steps, guidance)

    def init_state(self, max_slots: int, max_new_tokens: int, prefix_len: int | None = None) -> BatchState:
        columns = (prefix_len or self.config.prefix_len) + max_new_tokens
        slots = np.zeros(max_slots, np.int32)
        return BatchState(
            k=(),
            v=(),
            kv_valid=np.zeros((max_slots, columns), bool),
            hidden=np.zeros((max_slots, 0), np.float32),
            next_pos=slots,
            write_idx=slots,
            tokens=np.zeros((max_slots, max_new_tokens), np.int32),
            logprobs=np.zeros((max_slots, max_new_tokens), np.float32),
            n_generated=slots,
            max_new=slots,
            done=np.zeros(max_slots, bool),
            active=np.zeros(max_slots, bool),
            keys=jax.random.split(jax.random.key(0), max_slots),
            temperature=np.zeros(max_slots, np.float32),
            top_p=np.ones(max_slots, np.float32),
        )

    def select_rows(self, cache: PrefixCache, rows: np.ndarray) -> PrefixCache:
        rows = np.asarray(rows)
        return PrefixCache(
            k=cache.k[:, rows],
            v=cache.v[:, rows],
            mask=cache.mask[rows],
            positions=cache.positions[rows],
            length=cache.length[rows],
            last_hidden=cache.last_hidden[rows],
        )

    def insert(
        self,
        state: BatchState,
        cache: PrefixCache,
        inserts: Sequence[api.SlotInsert],
        rows: np.ndarray | None = None,
    ) -> BatchState:
        if rows is not None:
            cache = self.select_rows(cache, rows)
        self.calls.append(("insert", cache.mask.shape[0]))
        columns = api.insert_columns(inserts, cache.mask.shape[0], state.max_slots)
        kept = columns["slots"] < state.max_slots
        slots, rows = columns["slots"][kept], np.flatnonzero(kept)
        s = _copy(state)
        s.kv_valid[slots] = False
        s.kv_valid[slots, : cache.mask.shape[1]] = cache.mask[rows]
        s.next_pos[slots] = cache.length[rows]
        s.tokens[slots], s.logprobs[slots], s.n_generated[slots] = 0, 0.0, 0
        s.max_new[slots] = np.clip(columns["max_new"][kept], 1, state.max_new_tokens)
        s.done[slots], s.active[slots] = False, True
        s.temperature[slots], s.top_p[slots] = columns["temperature"][kept], columns["top_p"][kept]
        return state.replace(**s.__dict__)

    def decode(self, state: BatchState, num_steps: int, mode: SamplingMode) -> BatchState:
        self.calls.append(("decode", num_steps))
        s = _copy(state)
        for _ in range(num_steps):
            for slot in np.flatnonzero(s.active & ~s.done):
                token = s.next_pos[slot]
                s.tokens[slot, s.n_generated[slot]] = token
                s.logprobs[slot, s.n_generated[slot]] = -1.0
                s.n_generated[slot] += 1
                s.next_pos[slot] += 1
                s.done[slot] = token == self.eos_id or s.n_generated[slot] >= s.max_new[slot]
        return state.replace(**s.__dict__)

    def evict(self, state: BatchState, slots: np.ndarray) -> BatchState:
        self.calls.append(("evict", len(slots)))
        slots = np.asarray(slots)
        slots = slots[(slots >= 0) & (slots < state.max_slots)]
        s = _copy(state)
        s.active[slots], s.done[slots], s.kv_valid[slots] = False, False, False
        return state.replace(**s.__dict__)


@dataclasses.dataclass
class _Rows:
    """Writable copies of the batch state's host-side fields (the engine never updates in place)."""

    kv_valid: np.ndarray
    next_pos: np.ndarray
    tokens: np.ndarray
    logprobs: np.ndarray
    n_generated: np.ndarray
    max_new: np.ndarray
    done: np.ndarray
    active: np.ndarray
    temperature: np.ndarray
    top_p: np.ndarray


def _copy(state: BatchState) -> _Rows:
    return _Rows(**{f.name: np.array(getattr(state, f.name)) for f in dataclasses.fields(_Rows)})
