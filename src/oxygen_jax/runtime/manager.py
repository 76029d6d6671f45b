"""The KV cache manager: the request table, slots of the batch state and the admission queue.

Python bookkeeping only; every device update goes through the engine's jitted entry points with
bucketed shapes, so the number of compilations stays bounded whatever the traffic. What decoding produces
leaves as `TokenEvent`s (raw token ids); detokenizing and callbacks belong to the output stage.
"""

import collections
import dataclasses

import numpy as np

from oxygen_jax.engine import mesh
from oxygen_jax.engine.api import RuntimeEngine, SlotInsert
from oxygen_jax.engine.batch_state import BatchState, compiled_steps, state_bytes
from oxygen_jax.engine.sampling import MODES, SamplingMode
from oxygen_jax.models.pi05 import PrefixCache
from oxygen_jax.runtime.requests import RequestStatus, TextRequest, TextResult, TokenEvent


def bucket(n: int, limit: int, multiple: int = 1) -> int:
    """Smallest power of two >= n (capped at limit), rounded up to a multiple of `multiple` (the
    mesh's data axis, so rows split evenly over its devices): the padded batch size for n rows."""
    size = 1
    while size < n:
        size *= 2
    size = max(n, min(size, limit))
    return -(-size // multiple) * multiple


@dataclasses.dataclass
class _Pending:
    request: TextRequest
    cache: PrefixCache
    row: int


class KVCacheManager:
    """Owns the batch state σ̂ and the mapping request id -> slot. Requests are never dropped; a finished
    one leaves every table, so the tables hold at most the slots plus the admission queue."""

    def __init__(
        self,
        engine: RuntimeEngine,
        max_slots: int,
        max_new_tokens: int,
    ):
        mesh.check_divides(engine.data_size, max_slots=max_slots)
        self.engine = engine
        self.max_slots = max_slots
        self.max_new_tokens = max_new_tokens
        self.prefix_len = engine.config.prefix_len
        self.state: BatchState = engine.init_state(max_slots, max_new_tokens)
        self._slot_request: list[TextRequest | None] = [None] * max_slots
        # Slots split over the data axis in contiguous blocks, one per device; each device keeps its
        # own free list and a new request goes to the least loaded one.
        self.shards = engine.data_size
        block = max_slots // self.shards
        self._free = [collections.deque(range(d * block, (d + 1) * block)) for d in range(self.shards)]
        self._queue: collections.deque[_Pending] = collections.deque()
        self._streamed = np.zeros(max_slots, np.int64)
        self._status: dict[int, RequestStatus] = {}  # in-flight requests only
        self.tokens_generated = 0

    # --- request table ---
    @property
    def active(self) -> int:
        return self.max_slots - self.free_slots

    @property
    def free_slots(self) -> int:
        return sum(len(free) for free in self._free)

    def shard_load(self) -> list[int]:
        """Occupied slots per device of the data axis."""
        return [self.max_slots // self.shards - len(free) for free in self._free]

    def _take_slot(self) -> int:
        return max(self._free, key=len).popleft()

    @property
    def queued(self) -> int:
        return len(self._queue)

    @property
    def state_bytes(self) -> int:
        return state_bytes(self.state)

    @property
    def tracked(self) -> int:
        """Requests the manager's tables hold (queued or running)."""
        return len(self._status)

    def status(self, request_id: int) -> RequestStatus:
        """QUEUED or RUNNING while in flight; UNKNOWN once finished (or never seen)."""
        return self._status.get(request_id, RequestStatus.UNKNOWN)

    def fit_prefix(self, prefix_len: int) -> None:
        """Re-sizes the (empty) state for prefixes of at most `prefix_len` columns.

        A robot whose observations always mask a camera prefills 256 columns fewer per masked camera;
        a state sized to that prefix is smaller and every decode step attends fewer columns.
        """
        if self.active or self.queued:
            raise RuntimeError("fit_prefix needs an empty manager")
        if prefix_len != self.prefix_len:
            self.prefix_len = prefix_len
            self.state = self.engine.init_state(self.max_slots, self.max_new_tokens, prefix_len)

    def submit(self, request: TextRequest, cache: PrefixCache, row: int, frame: int) -> None:
        """Queues a request on row `row` of a frame's prefix cache; `admit` moves it into a slot."""
        self.check(request, cache)
        request.arrival_frame = frame
        self._queue.append(_Pending(request, cache, row))
        self._status[request.request_id] = RequestStatus.QUEUED

    def check(self, request: TextRequest, cache: PrefixCache) -> None:
        """ValueError if `submit` would refuse the request."""
        if cache.mask.shape[1] > self.prefix_len:
            raise ValueError(
                f"a prefix of {cache.mask.shape[1]} columns does not fit the batch state's {self.prefix_len} "
                "(it was sized for observations with fewer cameras; see KVCacheManager.fit_prefix)"
            )
        if not 1 <= request.max_new_tokens <= self.max_new_tokens:
            raise ValueError(
                f"max_new_tokens must lie in [1, {self.max_new_tokens}], got {request.max_new_tokens}"
            )
        if request.request_id in self._status:
            raise ValueError(f"request id {request.request_id} is already in flight")

    def admit(self, frame: int) -> None:
        """Moves queued requests (FIFO) into free slots, one bucketed insert per source cache."""
        groups: dict[int, list[tuple[_Pending, int]]] = {}
        while self._queue and self.free_slots:
            pending = self._queue.popleft()
            slot = self._take_slot()
            groups.setdefault(id(pending.cache), []).append((pending, slot))
        for entries in groups.values():
            self._insert(entries, frame)
        # Keep only single rows of queued requests' caches so whole frame caches can be freed.
        for pending in self._queue:
            if pending.cache.mask.shape[0] > 1:
                pending.cache = self.engine.select_rows(pending.cache, np.array([pending.row]))
                pending.row = 0

    def _insert(self, entries: list[tuple[_Pending, int]], frame: int) -> None:
        """One insert of a bucketed batch (the rows selected from their frame's cache in the same
        program): the padding rows repeat row 0 and go into no slot."""
        pad = bucket(len(entries), self.max_slots, self.shards) - len(entries)
        rows = np.array([p.row for p, _ in entries] + [0] * pad)
        inserts = [SlotInsert(slot, p.request.max_new_tokens, p.request.sampling) for p, slot in entries]
        self.state = self.engine.insert(self.state, entries[0][0].cache, inserts, rows)
        for pending, slot in entries:
            request = pending.request
            request.admitted_frame = frame
            self._slot_request[slot] = request
            self._streamed[slot] = 0
            self._status[request.request_id] = RequestStatus.RUNNING

    # --- decoding ---
    def decode(self, num_steps: int) -> None:
        if self.active and num_steps > 0:
            self.state = self.engine.decode(self.state, num_steps, self.sampling_mode())

    def sampling_mode(self) -> SamplingMode:
        """The sampling paths the occupied slots need, from their requests (the host's copy of what the
        state holds), so decode compiles no device-side branch."""
        rows = [request.sampling for request in self._slot_request if request is not None]
        return SamplingMode.of([r.temperature for r in rows], [r.top_p for r in rows])

    def compile_decode(self) -> None:
        """Runs every decode program steady state can call (each step count of `compiled_steps`, each
        sampling mode) on the state, where no slot is occupied: compiled, and the state unchanged."""
        if self.active:
            raise RuntimeError("compile_decode needs an empty manager")
        for steps in compiled_steps(self.max_new_tokens):
            for mode in MODES:
                self.state = self.engine.decode(self.state, steps, mode)

    def harvest(self, frame: int) -> list[TokenEvent]:
        """One event per slot with new tokens or done (done slots are evicted)."""
        if not self.active:
            return []
        # One device-to-host transfer per frame for everything harvesting reads.
        done, n_generated, tokens, logprobs = self.engine.to_host(
            (self.state.done, self.state.n_generated, self.state.tokens, self.state.logprobs)
        )
        events, free_slots = [], []
        for slot, request in enumerate(self._slot_request):
            if request is None:
                continue
            n, streamed = int(n_generated[slot]), int(self._streamed[slot])
            self.tokens_generated += n - streamed
            self._streamed[slot] = n
            result = None
            if done[slot]:
                eos = n > 0 and tokens[slot, n - 1] == self.engine.eos_id
                result = self._finish(
                    slot, tokens[slot, :n], logprobs[slot, :n], "eos" if eos else "length", frame
                )
                free_slots.append(slot)
            if n > streamed or result is not None:
                events.append(TokenEvent(request, tokens[slot, streamed:n].copy(), result))
        self._evict(free_slots)
        return events

    def cancel(self, request_id: int, frame: int = -1) -> TokenEvent | None:
        """Stops a queued or running request (its slot is freed at once): its final event, with the tokens
        not yet harvested. None if not in flight."""
        for i, pending in enumerate(self._queue):
            if pending.request.request_id == request_id:
                del self._queue[i]
                del self._status[request_id]
                empty = np.zeros(0, np.int32)
                result = _result(pending.request, empty, np.zeros(0, np.float32), "cancelled", frame)
                return TokenEvent(pending.request, empty, result)
        for slot, request in enumerate(self._slot_request):
            if request is not None and request.request_id == request_id:
                n_generated, tokens, logprobs = self.engine.to_host(
                    (self.state.n_generated, self.state.tokens, self.state.logprobs)
                )
                n, streamed = int(n_generated[slot]), int(self._streamed[slot])
                result = self._finish(slot, tokens[slot, :n], logprobs[slot, :n], "cancelled", frame)
                self._evict([slot])
                return TokenEvent(request, result.tokens[streamed:].copy(), result)
        return None

    def _finish(self, slot: int, tokens, logprobs, reason: str, frame: int) -> TextResult:
        request = self._slot_request[slot]
        self._slot_request[slot] = None
        del self._status[request.request_id]
        return _result(request, tokens, logprobs, reason, frame)

    def _evict(self, slots: list[int]) -> None:
        if not slots:
            return
        padded = np.full(self.max_slots, self.max_slots)  # one compiled shape for any count
        padded[: len(slots)] = slots
        self.state = self.engine.evict(self.state, padded)
        block = self.max_slots // self.shards
        for slot in slots:
            self._free[slot // block].append(slot)


def _result(request: TextRequest, tokens, logprobs, reason: str, frame: int) -> TextResult:
    return TextResult(
        request_id=request.request_id,
        tokens=np.asarray(tokens, np.int32).copy(),
        logprobs=np.asarray(logprobs, np.float32).copy(),
        text="",
        finish_reason=reason,
        arrival_frame=request.arrival_frame,
        admitted_frame=request.admitted_frame,
        finished_frame=frame,
    )
