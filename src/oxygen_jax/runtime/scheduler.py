"""The frame loop: actions on a hard per-frame deadline, language batched across frames.

Per frame: prefill the frame's observations once (rows padded to a bucketed batch size) -> denoise ->
emit the action chunks -> queue the frame's language requests on the same prefix cache -> admit them into
free slots -> decode(k) for every active slot -> harvest new tokens and finished requests as raw
`TokenEvent`s (the runtime's output stage detokenizes them and runs callbacks) -> evict. k comes from a
FixedK or DeadlineK policy.

The two halves of a frame, `act` (the hard-deadline path) and `advance` (a decode chunk and its
harvest), are also what the device loop (`runtime/device_loop.py`) schedules on its own clock.

An observation may draw several action chunks (`FrameInput.samples`): its first noise row denoises in the
batch's program like any other row's, and all its samples denoise once more together on its row of the same
prefix cache (rows padded to a power of two up to `max_samples`), as the inline runtime draws them; the
caller keeps one (`Policy.finish`).

A frame input may also carry task requests, each with its instruction's token suffix: one `Engine.extend`
call per frame appends every task's suffix to its observation's prefix, and the extended rows join the
batch state like any other request (the state reserves `task_suffix_len` columns for them).
"""

import dataclasses
import time
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from oxygen_jax.engine import prompt_buckets
from oxygen_jax.engine.api import ChunkGuidance, RuntimeEngine
from oxygen_jax.models import inputs
from oxygen_jax.runtime.k_policy import FixedK, KPolicy
from oxygen_jax.runtime.manager import KVCacheManager, bucket
from oxygen_jax.runtime.requests import TextRequest, TextResult, TokenEvent


@dataclasses.dataclass
class FrameInput:
    """One observation (model-level arrays with batch dim 1), optional noise [samples, H, A], the language
    requests that continue this observation's prompt (they share its prefix cache), the task requests,
    each decoding after its own instruction tokens appended to that prefix, the real-time-chunking
    guidance of its actions (None: plain) and the action chunks it draws."""

    arrays: dict[str, np.ndarray]
    noise: np.ndarray | None = None
    requests: list[TextRequest] = dataclasses.field(default_factory=list)
    tasks: list[tuple[TextRequest, Sequence[int]]] = dataclasses.field(default_factory=list)
    guidance: ChunkGuidance | None = None
    samples: int = 1


@dataclasses.dataclass
class DecodeChunk:
    k: int  # decode steps run (0: nothing was active)
    decode_batch: int  # active slots during decode
    new_tokens: int
    events: list[TokenEvent]  # new tokens and finished requests, for the output stage
    decode_s: float

    @property
    def finished(self) -> list[TextResult]:
        return [event.result for event in self.events if event.result is not None]


@dataclasses.dataclass
class FrameResult:
    frame: int
    actions: list[np.ndarray]  # per input, in input order: [H, action_dim], or [samples, H, action_dim]
    finished: list[TextResult]  # their text filled once the runtime's output stage saw them
    k: int
    decode_batch: int  # active slots during decode
    new_tokens: int  # language tokens produced this frame
    action_s: float  # prefill + denoise, until the actions are on the host
    decode_s: float
    total_s: float
    events: list[TokenEvent] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class PendingActions:
    """Actions dispatched and not yet on the host: [B, H, A] on the device, the first `inputs` rows real,
    and the chunks of each input that draws several (input index -> [rows, H, A], the first samples real)."""

    actions: Any
    inputs: int
    samples: dict[int, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class StartedDecode:
    """A decode dispatched and not yet harvested."""

    k: int
    decode_batch: int  # active slots
    tokens_before: int
    start: float


class FrameScheduler:
    def __init__(
        self,
        engine: RuntimeEngine,
        manager: KVCacheManager,
        k_policy: KPolicy,
        *,
        num_steps: int = 10,
        max_prefill_batch: int = 4,
        seed: int = 0,
        task_suffix_len: int = 0,
        max_frame_tasks: int = 0,
        max_samples: int = 1,
    ):
        """task_suffix_len: the columns of a task's instruction suffix (0: no task requests);
        max_frame_tasks: the most task requests one frame may carry (all its observations together);
        max_samples: the most action chunks one observation may draw."""
        self.engine = engine
        self.max_samples = max_samples
        self.task_suffix_len = task_suffix_len
        self.max_frame_tasks = max_frame_tasks if task_suffix_len else 0
        self.manager = manager
        self.k_policy = k_policy
        self.num_steps = num_steps
        self.max_prefill_batch = max_prefill_batch
        self.frame = 0
        self._rng = np.random.default_rng(seed)
        self._chunk_after_act: tuple[int | None, int] | None = None  # (k, admission frame) for `act`
        self._started: StartedDecode | None = None  # a decode dispatched and not yet harvested

    def step(self, frame_inputs: list[FrameInput]) -> FrameResult:
        """One frame: the actions, then decode(k). `act` dispatches the decode before it pulls the actions
        to the host, so the device runs it while the host copies the actions; decode_s is what the frame
        waits for it after that."""
        start = time.perf_counter()
        actions = self._act_then_chunk(frame_inputs, None, self.frame) if frame_inputs else []
        action_s = time.perf_counter() - start
        if self._started is None:
            self._started = self._start_chunk(None, self.frame)
        k = self._started.k
        chunk = self.advance(k)
        total_s = time.perf_counter() - start
        self.k_policy.observe_decode(k, chunk.decode_s)
        if frame_inputs:
            self.k_policy.observe_action(action_s, total_s - action_s - chunk.decode_s)
        result = FrameResult(
            frame=self.frame,
            actions=actions,
            finished=chunk.finished,
            k=k,
            decode_batch=chunk.decode_batch,
            new_tokens=chunk.new_tokens,
            action_s=action_s,
            decode_s=chunk.decode_s,
            total_s=total_s,
            events=chunk.events,
        )
        self.frame += 1
        return result

    def act_only(
        self, frame_inputs: list[FrameInput], then_chunk: bool = False, k: int | None = None
    ) -> list[np.ndarray]:
        """A frame of actions alone (the device loop's async mode, where language runs in its own
        chunks): `act`, and the frame counter moves on. then_chunk: the decode chunk of `k` steps (None:
        the k policy's choice) that follows these actions is dispatched before they are pulled to the host;
        the next `decode_chunk` harvests it."""
        if then_chunk:
            actions = self._act_then_chunk(frame_inputs, k, self.frame + 1)
        else:
            actions = self.act(frame_inputs)
        self.frame += 1
        return actions

    def decode_chunk(self, k: int | None = None) -> tuple[DecodeChunk, float]:
        """A frame of language alone: admit what is queued, decode `k` steps (None: the k policy's choice)
        and harvest, or harvest the chunk `act_only` dispatched; the k policy learns what the chunk cost.
        Returns the chunk and its seconds (from dispatch, or from when the actions were on the host, to the
        end of its harvest)."""
        if self._started is None:
            self._started = self._start_chunk(k, self.frame)
        start = self._started.start
        chunk = self.advance(self._started.k)
        chunk_s = time.perf_counter() - start
        self.k_policy.observe_decode(chunk.k, chunk_s)
        self.frame += 1
        return chunk, chunk_s

    def advance(self, k: int) -> DecodeChunk:
        """decode(k) for every active slot (admitted requests only), unless `act` dispatched it already,
        then harvest: new tokens and done requests as events (done ones evicted). The harvest's transfer
        to the host is the one wait."""
        started, self._started = self._started, None
        if started is None:
            started = self._start_decode(k)
        events = self.manager.harvest(self.frame)
        return DecodeChunk(
            k=started.k if started.decode_batch else 0,
            decode_batch=started.decode_batch,
            new_tokens=self.manager.tokens_generated - started.tokens_before,
            events=events,
            decode_s=time.perf_counter() - started.start,
        )

    def _start_chunk(self, k: int | None, frame: int) -> StartedDecode:
        """Admits what is queued (as of `frame`) and dispatches decode(k) (None: the k policy's choice)."""
        self.manager.admit(frame)
        if k is None:
            k = self.k_policy.choose() if self.manager.active else 0
        return self._start_decode(k)

    def _start_decode(self, k: int) -> StartedDecode:
        started = StartedDecode(k, self.manager.active, self.manager.tokens_generated, time.perf_counter())
        if k and started.decode_batch:
            self.manager.decode(k)
        return started

    def _act_then_chunk(self, frame_inputs: list[FrameInput], k: int | None, frame: int) -> list[np.ndarray]:
        """`act`, with the decode chunk that follows it (admitted as of `frame`) dispatched before the
        actions are pulled to the host."""
        self._chunk_after_act = (k, frame)
        try:
            return self.act(frame_inputs)
        finally:
            self._chunk_after_act = None

    def act(self, frame_inputs: list[FrameInput]) -> list[np.ndarray]:
        """Prefill + denoise (one program, `Engine.act`): per input its action chunk [H, A] (its chunks
        [samples, H, A] when it draws several), on the host; the decode chunk `_act_then_chunk` asks for
        is dispatched before the pull."""
        pending = self.start_act(frame_inputs)
        language = self.manager.active or self.manager.queued
        if self._chunk_after_act is not None and self._started is None and language:
            self._started = self._start_chunk(*self._chunk_after_act)
        actions, samples = self.engine.to_host((pending.actions, pending.samples))
        if self._started is not None:
            self._started.start = time.perf_counter()  # the chunk's cost is what remains of it now
        actions = list(actions[: pending.inputs])
        for i, chunks in samples.items():
            actions[i] = chunks[: frame_inputs[i].samples]
        return actions

    def start_act(self, frame_inputs: list[FrameInput]) -> PendingActions:
        """Dispatches prefill + denoise (`Engine.act`) and leaves the actions on the device. The inputs'
        language requests are queued on the same prefix cache (`manager.admit` moves them into slots). A
        batch with a guided input runs the engine's guided program once, its other rows (and padding)
        unguided; else the plain one."""
        n = len(frame_inputs)
        size = bucket(n, self.max_prefill_batch, self.engine.data_size)
        rows = list(range(n)) + [n - 1] * (size - n)  # padding repeats a real row
        # Each row is checked and converted to the model's dtypes on its own before the rows are stacked,
        # so one row's keys or dtypes can never change how another row is read.
        config = self.engine.config
        observations = [inputs.observation_from_arrays(item.arrays, config) for item in frame_inputs]
        obs = jax.tree.map(lambda *column: np.concatenate(column), *[observations[r] for r in rows])
        noises = [self._noise(item) for item in frame_inputs]
        noise = np.concatenate([noises[r][:1] for r in rows])
        guidance = [item.guidance for item in frame_inputs]
        guided = guidance if any(row is not None for row in guidance) else ()
        cache, actions = self.engine.act(obs, noise, self.num_steps, guided)
        samples = {
            row: self._samples(cache, row, noises[row], item.guidance)
            for row, item in enumerate(frame_inputs)
            if item.samples > 1
        }
        queued = [(request, cache, row) for row, item in enumerate(frame_inputs) for request in item.requests]
        tasks = [
            (request, suffix, row) for row, item in enumerate(frame_inputs) for request, suffix in item.tasks
        ]
        if tasks:
            if len(tasks) > self.max_frame_tasks:
                raise ValueError(
                    f"a frame takes at most {self.max_frame_tasks} task requests, got {len(tasks)}"
                )
            rows = np.array([row for _, _, row in tasks])
            extended = self.engine.extend(
                cache, rows, [suffix for _, suffix, _ in tasks], self.task_suffix_len
            )
            queued += [(request, extended, t) for t, (request, _, _) in enumerate(tasks)]
        for request, source, _ in queued:  # all or none join, so a failed batch leaves nothing behind
            self.manager.check(request, source)
        for request, source, row in queued:
            self.manager.submit(request, source, row, self.frame)
        return PendingActions(actions, n, samples)

    def _samples(self, cache: Any, row: int, noise: np.ndarray, guidance: ChunkGuidance | None) -> Any:
        """The chunks [size, H, A] of one observation drawing several, on the device: its noise [samples,
        H, A] denoised on its row of the prefix cache, padded (repeating the last noise) to a power of
        two, so the shapes are those warm-up compiled."""
        samples = len(noise)
        if samples > self.max_samples:
            raise ValueError(f"an observation draws at most {self.max_samples} chunks, got {samples}")
        size = bucket(samples, self.max_samples, self.engine.data_size)
        padded = np.concatenate([noise, np.repeat(noise[-1:], size - samples, axis=0)])
        rows = self.engine.select_rows(cache, np.full(size, row, np.int32))
        guided = () if guidance is None else (guidance,) * size
        return self.engine.denoise(rows, padded, self.num_steps, guided)

    def _noise(self, item: FrameInput) -> np.ndarray:
        """The input's noise [samples, H, A]: its own, else drawn."""
        if item.noise is not None:
            noise = np.asarray(item.noise, np.float32)
            if len(noise) != item.samples:
                raise ValueError(f"noise of {len(noise)} chunks for {item.samples} samples")
            return noise
        shape = (item.samples, self.engine.config.action_horizon, self.engine.config.action_dim)
        return self._rng.standard_normal(shape, dtype=np.float32)

    def sample_sizes(self) -> list[int]:
        """Every padded row count `_samples` denoises (none when an observation draws one chunk)."""
        data = self.engine.data_size
        return sorted({bucket(n, self.max_samples, data) for n in range(2, self.max_samples + 1)})

    def prefill_sizes(self) -> list[int]:
        """Every padded batch size `act` can prefill."""
        data = self.engine.data_size
        return sorted({bucket(n, self.max_prefill_batch, data) for n in range(1, self.max_prefill_batch + 1)})

    def prompt_variants(self, example: dict[str, np.ndarray]) -> list[dict[str, np.ndarray]]:
        """The example once per prompt width the engine's prefill may cut a batch to
        (`prompt_buckets.widths`), its prompt filling that width, so warm-up compiles every one."""
        shape = np.shape(example["tokenized_prompt_mask"])
        masks = prompt_buckets.filled_masks(shape, self.engine.prompt_buckets)
        return [{**example, "tokenized_prompt_mask": mask} for mask in masks]

    def warm_up_actions(self, example: dict[str, np.ndarray]) -> None:
        """Compiles the action path for every prefill size and prompt width."""
        for variant in self.prompt_variants(example):
            for size in self.prefill_sizes():
                self.act([FrameInput(variant) for _ in range(size)])

    def warm_up_guided(self, example: dict[str, np.ndarray]) -> None:
        """Compiles the guided denoiser for every prefill size and prompt width (one guided row, the others
        plain), so robots with real-time chunking join and leave without compiling."""
        config = self.engine.config
        prev_chunk = np.zeros((config.action_horizon, config.action_dim), np.float32)
        for variant in self.prompt_variants(example):
            guided = FrameInput(variant, guidance=ChunkGuidance(prev_chunk, 1, config.action_horizon))
            for size in self.prefill_sizes():
                self.act([guided] + [FrameInput(variant) for _ in range(size - 1)])

    def warm_up_samples(self, example: dict[str, np.ndarray], guided: bool) -> None:
        """Compiles the denoising of several chunks on one row for every prefill size, prompt width and
        padded sample count (guided too when `guided`), so observations drawing several never compile."""
        config = self.engine.config
        prev_chunk = np.zeros((config.action_horizon, config.action_dim), np.float32)
        guidances = [None, ChunkGuidance(prev_chunk, 1, config.action_horizon)] if guided else [None]
        for variant in self.prompt_variants(example):
            for size in self.prefill_sizes():
                for samples in self.sample_sizes():
                    for guidance in guidances:
                        drawing = FrameInput(variant, guidance=guidance, samples=samples)
                        self.act([drawing] + [FrameInput(variant) for _ in range(size - 1)])

    def warmup(self, example: dict[str, np.ndarray]) -> None:
        """Sizes the batch state to the example's prefix (its masked cameras are left out, as in every
        frame of that robot), compiles every shape steady state can meet (each prefill bucket and prompt
        width, each insert bucket, every decode program, evict) and leaves the manager empty. `example`: one
        observation's arrays (batch dim 1)."""
        obs = inputs.observation_from_arrays(example, self.engine.config)
        self.manager.fit_prefix(self.engine.prefix_len(obs) + self.task_suffix_len)
        self.manager.compile_decode()
        data = self.engine.data_size
        sizes = self.prefill_sizes()
        slots = self.manager.max_slots
        saved_policy, self.k_policy = self.k_policy, FixedK(1)
        request_id = -1
        for size in sizes:
            frame_inputs = [FrameInput(example) for _ in range(size)]
            # Enough requests on this prefill batch to exercise every insert bucket up to max_slots.
            for n_requests in sorted({bucket(n, slots, data) for n in range(1, slots + 1)}):
                requests = [TextRequest(request_id - i, max_new_tokens=1) for i in range(n_requests)]
                request_id -= n_requests
                for i, request in enumerate(requests):
                    frame_inputs[i % size].requests.append(request)
                self.step(frame_inputs)
                frame_inputs = [FrameInput(example) for _ in range(size)]
        # A queued request's cache compacted to its single row (from each prefill bucket), inserted later.
        for size in sizes:
            overflow = [TextRequest(request_id - i, max_new_tokens=2) for i in range(slots + 1)]
            request_id -= slots + 1
            self.step(
                [FrameInput(example, requests=overflow)] + [FrameInput(example) for _ in range(size - 1)]
            )
            self._drain()
        if self.max_frame_tasks:
            self._warm_up_tasks(example, sizes, request_id)
        self.warm_up_actions(example)
        self.k_policy = saved_policy
        self.frame = 0

    def _warm_up_tasks(self, example: dict[str, np.ndarray], sizes: list[int], request_id: int) -> None:
        """Every extension shape (prefill batch x task bucket) and every insert of extended rows into as
        many free slots as steady state can leave (the others queue and are compacted)."""
        slots = self.manager.max_slots
        for size in sizes:
            for n_tasks in sorted(
                {bucket(n, self.max_frame_tasks) for n in range(1, self.max_frame_tasks + 1)}
            ):
                inserts = {bucket(m, slots, self.engine.data_size) for m in range(1, min(n_tasks, slots) + 1)}
                for free in sorted(inserts):
                    busy = [TextRequest(request_id - i, max_new_tokens=2) for i in range(slots - free)]
                    request_id -= len(busy)
                    if busy:
                        self.step([FrameInput(example, requests=busy)])
                    frame_inputs = [FrameInput(example) for _ in range(size)]
                    for i in range(n_tasks):
                        frame_inputs[i % size].tasks.append(
                            (TextRequest(request_id - i, max_new_tokens=1), [1])
                        )
                    request_id -= n_tasks
                    self.step(frame_inputs)
                    self._drain()

    def _drain(self) -> None:
        while self.manager.active or self.manager.queued:
            self.step([])
