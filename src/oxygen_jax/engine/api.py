"""The engine contract: what the runtime and the policies may ask of an engine.

`engine.Engine` implements it over the pi0.5 model; `tests/fake_engine.py` implements the runtime's
part with outputs computable by hand, so the KV cache manager and the schedulers are tested without a
model. Device-side values are pytrees of fixed shape (`PrefixCache`, `BatchState`); what a request asks
for arrives as small host-side structs (`SlotInsert`, `SamplingParams`), turned into per-row arrays in
one place (`insert_columns`).
"""

import dataclasses
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import jax
import numpy as np

from oxygen_jax.engine.batch_state import BatchState
from oxygen_jax.engine.guidance import SCHEDULES, prefix_weights
from oxygen_jax.engine.language import TextOutput
from oxygen_jax.engine.sampling import SamplingMode
from oxygen_jax.errors import InvalidArgumentError
from oxygen_jax.models.pi05 import Observation, Pi05Config, PrefixCache


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """How one request picks its tokens: greedy at temperature 0, else temperature + nucleus (top_p)
    sampling from its own stream `seed`."""

    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0


@dataclasses.dataclass(frozen=True)
class SlotInsert:
    """One prefix row going into one slot of the batch state, with its request's limits."""

    slot: int
    max_new_tokens: int
    sampling: SamplingParams = SamplingParams()


def insert_columns(inserts: Sequence[SlotInsert], rows: int, max_slots: int) -> dict[str, np.ndarray]:
    """The per-row arrays `batch_state.insert` takes, for a cache of `rows` rows: row i goes where
    inserts[i] says; rows beyond the inserts are padding, sent to slot `max_slots` (out of range: dropped).
    """
    if len(inserts) > rows:
        raise ValueError(f"{len(inserts)} inserts for a prefix cache of {rows} rows")
    pad = rows - len(inserts)
    return {
        "slots": np.array([i.slot for i in inserts] + [max_slots] * pad, np.int32),
        "max_new": np.array([i.max_new_tokens for i in inserts] + [1] * pad, np.int32),
        "temperature": np.array([i.sampling.temperature for i in inserts] + [0.0] * pad, np.float32),
        "top_p": np.array([i.sampling.top_p for i in inserts] + [1.0] * pad, np.float32),
        "seeds": np.array([i.sampling.seed for i in inserts] + [0] * pad, np.uint32),
    }


@dataclasses.dataclass(frozen=True)
class ChunkGuidance:
    """Real-time chunking for one row (`engine/guidance.py`): the previous chunk [H, A] in model space,
    aligned so that prev_chunk[i] is what the robot executes at the new chunk's index i; the robot executes
    `delay` of them before the new chunk arrives, and the new chunk blends into them up to `horizon`."""

    prev_chunk: np.ndarray
    delay: int
    horizon: int
    schedule: str = "exp"
    max_guidance_weight: float = 5.0

    def check(self, horizon: int, action_dim: int) -> None:
        """Raises InvalidArgumentError (one line) for values the guidance cannot use."""
        shape = np.shape(self.prev_chunk)
        if shape != (horizon, action_dim):
            raise InvalidArgumentError(
                f"prev_chunk has shape {shape}; the model needs ({horizon}, {action_dim})"
            )
        if not np.isfinite(self.prev_chunk).all():
            raise InvalidArgumentError("prev_chunk has non-finite values")
        if not all(isinstance(v, int | np.integer) for v in (self.delay, self.horizon)):
            raise InvalidArgumentError(
                f"RTC delay and horizon must be ints, got {self.delay!r}, {self.horizon!r}"
            )
        if not 0 <= self.delay <= self.horizon <= horizon:
            raise InvalidArgumentError(
                f"RTC needs 0 <= delay <= horizon <= {horizon}, got delay={self.delay} horizon={self.horizon}"
            )
        if self.schedule not in SCHEDULES:
            raise InvalidArgumentError(
                f"unknown RTC schedule {self.schedule!r}; use one of {', '.join(SCHEDULES)}"
            )
        if not (np.isfinite(self.max_guidance_weight) and self.max_guidance_weight > 0):
            raise InvalidArgumentError(f"max_guidance_weight must be > 0, got {self.max_guidance_weight}")


def guidance_columns(
    rows: Sequence[ChunkGuidance | None], batch: int, horizon: int, action_dim: int
) -> dict[str, np.ndarray]:
    """The per-row arrays of `guidance.Guidance` for a batch of `batch` rows: row i is guided as rows[i]
    says; None and rows beyond `rows` (padding) get zero weights and nothing frozen, i.e. plain actions."""
    if len(rows) > batch:
        raise ValueError(f"{len(rows)} guidance rows for a batch of {batch}")
    columns = {
        "prev_chunk": np.zeros((batch, horizon, action_dim), np.float32),
        "weights": np.zeros((batch, horizon), np.float32),
        "max_guidance_weight": np.ones(batch, np.float32),
        "frozen": np.zeros((batch, horizon), bool),
    }
    for i, row in enumerate(rows):
        if row is None:
            continue
        row.check(horizon, action_dim)
        columns["prev_chunk"][i] = row.prev_chunk
        columns["weights"][i] = prefix_weights(row.delay, row.horizon, horizon, row.schedule)
        columns["max_guidance_weight"][i] = row.max_guidance_weight
        columns["frozen"][i] = np.arange(horizon) < row.delay
    return columns


@runtime_checkable
class RuntimeEngine(Protocol):
    """What the runtime (KV cache manager, frame scheduler, device loop) calls: actions for a batch of
    observations, and the batch state that decodes language requests from many frames together."""

    config: Pi05Config
    eos_id: int
    data_size: int  # devices the rows split over: batches and slot counts are multiples of it
    prompt_buckets: tuple[int, ...]  # widths prefill cuts prompts to (engine/prompt_buckets.py)

    def prefill(self, obs: Observation) -> PrefixCache:
        """One prefix pass over images and prompt."""

    def to_host(self, tree: Any) -> Any:
        """Device arrays as numpy on this host (gathered across processes on a multi-host mesh)."""

    def prefix_len(self, obs: Observation) -> int:
        """Columns `prefill(obs)` produces."""

    def denoise(
        self,
        cache: PrefixCache,
        noise: jax.Array,
        num_steps: int = 10,
        guidance: Sequence[ChunkGuidance | None] = (),
    ) -> jax.Array:
        """Actions [B, H, A] from noise [B, H, A]; reads the cache, never writes it. guidance[i] guides
        row i towards its previous chunk (real-time chunking); None, missing rows and () are plain."""

    def act(
        self,
        obs: Observation,
        noise: jax.Array,
        num_steps: int = 10,
        guidance: Sequence[ChunkGuidance | None] = (),
    ) -> tuple[PrefixCache, jax.Array]:
        """`prefill` then `denoise` in one call: (the prefix cache, the actions)."""

    def init_state(self, max_slots: int, max_new_tokens: int, prefix_len: int | None = None) -> BatchState:
        """An empty batch state: `max_slots` slots of up to `max_new_tokens` tokens on prefixes of up to
        `prefix_len` columns."""

    def select_rows(self, cache: PrefixCache, rows: np.ndarray) -> PrefixCache:
        """Rows of a prefix cache, in the order given."""

    def insert(
        self,
        state: BatchState,
        cache: PrefixCache,
        inserts: Sequence[SlotInsert],
        rows: np.ndarray | None = None,
    ) -> BatchState:
        """Row i of `cache` (or row rows[i]) into the slot inserts[i] names; rows beyond the inserts are
        padding."""

    def decode(self, state: BatchState, num_steps: int, mode: SamplingMode) -> BatchState:
        """Up to `num_steps` tokens for every active, unfinished slot; `mode`: the sampling paths the
        occupied slots need (known on the host from their requests)."""

    def evict(self, state: BatchState, slots: np.ndarray) -> BatchState:
        """Frees slots (indices outside [0, max_slots) are ignored)."""


@runtime_checkable
class EngineAPI(RuntimeEngine, Protocol):
    """The whole contract: the runtime's part plus what a single policy calls directly."""

    def noise(self, rng: jax.Array, batch: int) -> jax.Array:
        """Standard normal noise [batch, H, A]."""

    def generate(
        self,
        cache: PrefixCache,
        max_new_tokens: int,
        *,
        temperature: float | np.ndarray = 0.0,
        top_p: float | np.ndarray = 1.0,
        max_new: int | np.ndarray | None = None,
        seed: int = 0,
    ) -> TextOutput:
        """Decodes every row of the cache to completion."""

    def score(self, cache: PrefixCache, tokens: np.ndarray) -> jax.Array:
        """Teacher-forced log-probabilities of tokens [B, N]."""

    def extend(
        self, cache: PrefixCache, rows: np.ndarray, suffixes: list, suffix_len: int | None = None
    ) -> PrefixCache:
        """One token suffix per task appended to the prefix rows `rows`."""

    def act_and_speak(
        self, obs: Observation, noise: jax.Array, num_steps: int, max_new_tokens: int, **text_kwargs
    ) -> tuple[jax.Array, TextOutput]:
        """One prefill feeding both the action expert and the language decoder."""
