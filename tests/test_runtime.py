"""Continuous batching across frames: equivalence with decoding alone, bounded compilations, admission."""

import dataclasses
import logging

import numpy as np
import pytest
from conftest import GOLDEN, golden_inputs

from oxygen_jax.benchmarks import arrivals
from oxygen_jax.engine import api
from oxygen_jax.engine.compile_counter import CompileCounter
from oxygen_jax.engine.engine import Engine
from oxygen_jax.models import inputs
from oxygen_jax.runtime import runtime
from oxygen_jax.runtime.k_policy import DeadlineK, DelayBoundK, FixedK
from oxygen_jax.runtime.manager import KVCacheManager
from oxygen_jax.runtime.requests import RequestStatus, TextRequest
from oxygen_jax.runtime.runtime import RuntimeConfig
from oxygen_jax.runtime.scheduler import FrameInput, FrameScheduler
from oxygen_jax.tokenizer import Tokenizer

MAX_NEW = 8


@pytest.fixture(scope="module")
def engine(golden_params, tiny_config):
    return Engine(golden_params, tiny_config)


@pytest.fixture(scope="module")
def variants(model_io, tiny_config):
    """Observations with different prompts and a masked camera (batch dim 1 each)."""
    arrays = golden_inputs(model_io)
    rows = [{k: v[i : i + 1] for k, v in arrays.items()} for i in range(2)]  # row 1 masks a camera
    tokenizer = Tokenizer(
        GOLDEN / "tokenizer" / "tiny_paligemma_standin.model", max_len=tiny_config.max_token_len
    )
    tokens, mask = tokenizer.tokenize("open the top drawer and put the bowl inside")
    rows.append({**rows[0], "tokenized_prompt": tokens[None], "tokenized_prompt_mask": mask[None]})
    tokens, mask = tokenizer.tokenize("turn on the stove", state=np.linspace(-1, 1, 8))
    rows.append({**rows[1], "tokenized_prompt": tokens[None], "tokenized_prompt_mask": mask[None]})
    return [{k: v for k, v in r.items() if k != "noise"} for r in rows]


def _noise(frame: int, config) -> np.ndarray:
    return np.random.default_rng(frame).standard_normal(
        (1, config.action_horizon, config.action_dim), np.float32
    )


def _run(engine, variants, pattern, frames, max_slots, k_of_frame):
    """Runs the frame loop: (requests: id -> (variant, length), results: id -> TextResult, actions)."""
    manager = KVCacheManager(engine, max_slots, MAX_NEW)
    scheduler = FrameScheduler(engine, manager, FixedK(1), max_prefill_batch=1)
    requests, results, actions = {}, {}, []
    next_id, frame = 0, 0
    while frame < frames or manager.active or manager.queued:
        scheduler.k_policy = FixedK(k_of_frame(frame))
        variant = frame % len(variants)
        new = []
        if frame < frames:
            for length in pattern.lengths_at(frame):
                new.append(TextRequest(next_id, length))
                requests[next_id] = (variant, length)
                next_id += 1
        result = scheduler.step([FrameInput(variants[variant], _noise(frame, engine.config), new)])
        actions.append((variant, frame, result.actions[0]))
        results.update({r.request_id: r for r in result.finished})
        frame += 1
    return requests, results, actions


@pytest.mark.parametrize(
    "pattern",
    [
        arrivals.ArrivalPattern("uniform", 1.0, (MAX_NEW,)),
        arrivals.ArrivalPattern("poisson", 1.5, (MAX_NEW,), seed=3),
        arrivals.ArrivalPattern("random_length", 2.0, (3, MAX_NEW), long_fraction=0.5, seed=4),
    ],
    ids=["uniform", "poisson", "random_length"],
)
def test_batched_text_equals_text_decoded_alone(engine, variants, pattern):
    requests, results, actions = _run(
        engine, variants, pattern, frames=8, max_slots=4, k_of_frame=lambda f: 1 + f % 3
    )
    assert sorted(results) == sorted(requests)  # none lost
    for request_id, (variant, length) in requests.items():
        obs = inputs.observation_from_arrays(variants[variant], engine.config)
        alone = engine.generate(engine.prefill(obs), MAX_NEW, max_new=length)
        n = int(alone.lengths[0])
        got = results[request_id]
        np.testing.assert_array_equal(got.tokens, np.asarray(alone.tokens)[0, :n])
        np.testing.assert_allclose(got.logprobs, np.asarray(alone.logprobs)[0, :n], rtol=0, atol=1e-5)
    for variant, frame, chunk in actions:
        obs = inputs.observation_from_arrays(variants[variant], engine.config)
        expected = engine.denoise(engine.prefill(obs), _noise(frame, engine.config), 10)
        np.testing.assert_allclose(chunk, np.asarray(expected)[0], rtol=0, atol=1e-5)


def test_sampled_text_equals_alone_with_the_same_seed(engine, variants):
    manager = KVCacheManager(engine, 4, MAX_NEW)
    scheduler = FrameScheduler(engine, manager, FixedK(3), max_prefill_batch=1)
    results = {}
    for frame in range(3):
        request = TextRequest(frame, MAX_NEW, temperature=8.0, seed=100 + frame)
        results.update(
            {
                r.request_id: r
                for r in scheduler.step([FrameInput(variants[frame], requests=[request])]).finished
            }
        )
    while manager.active:
        results.update({r.request_id: r for r in scheduler.step([]).finished})
    assert len({tuple(r.tokens) for r in results.values()}) > 1  # the hot temperature really samples
    for frame, result in results.items():
        cache = engine.prefill(inputs.observation_from_arrays(variants[frame], engine.config))
        manager_alone = KVCacheManager(engine, 1, MAX_NEW)
        manager_alone.submit(TextRequest(0, MAX_NEW, temperature=8.0, seed=100 + frame), cache, 0, 0)
        manager_alone.admit(0)
        manager_alone.decode(MAX_NEW)
        (alone,) = manager_alone.harvest(0)
        np.testing.assert_array_equal(result.tokens, alone.result.tokens)


@pytest.mark.integration
def test_no_compilation_after_warmup(engine, variants):
    manager = KVCacheManager(engine, 4, MAX_NEW)
    scheduler = FrameScheduler(engine, manager, FixedK(1), max_prefill_batch=2)
    scheduler.warmup(variants[0])
    patterns = [
        arrivals.ArrivalPattern("uniform", 2.0, (MAX_NEW,)),
        arrivals.ArrivalPattern("poisson", 1.0, (MAX_NEW,), seed=1),
        arrivals.ArrivalPattern("random_length", 0.5, (2, MAX_NEW), seed=2),
    ]
    rng = np.random.default_rng(0)
    with CompileCounter() as counter:
        for frame in range(200):
            scheduler.k_policy = FixedK(int(rng.integers(0, 7)))
            lengths = patterns[(frame // 20) % 3].lengths_at(frame)
            robots = 1 + frame % 2  # one or two observations per frame
            frame_inputs = [FrameInput(variants[(frame + r) % 4]) for r in range(robots)]
            for i, length in enumerate(lengths):
                frame_inputs[i % robots].requests.append(TextRequest(frame * 100 + i, length))
            scheduler.step(frame_inputs)
    assert counter.count == 0


def test_more_requests_than_slots_queue_and_complete(engine, variants):
    frames = runtime.build(
        engine, RuntimeConfig(max_slots=2, max_new_tokens=MAX_NEW, loop=None, k=4, max_prefill_batch=1)
    )
    manager = frames.manager
    streamed: dict[int, list[int]] = {}
    done = []
    requests = [
        TextRequest(
            i,
            MAX_NEW,
            on_tokens=lambda rid, t, _: streamed.setdefault(rid, []).extend(t),
            on_done=done.append,
        )
        for i in range(5)
    ]
    first = frames.step([FrameInput(variants[0], requests=requests)])
    assert manager.active == 2 and manager.queued == 3
    assert [manager.status(i) for i in range(5)] == [RequestStatus.RUNNING] * 2 + [RequestStatus.QUEUED] * 3
    results = list(first.finished)
    while manager.active or manager.queued:
        results += frames.step([]).finished
    assert sorted(r.request_id for r in results) == list(range(5))  # slots were evicted and reused
    assert [r.request_id for r in done] == [r.request_id for r in results]
    for r in results:
        assert len(r.tokens) == MAX_NEW and r.finish_reason == "length"
        assert streamed[r.request_id] == list(r.tokens)  # streaming delivered every token once
    waits = {r.request_id: r.queue_wait_frames for r in results}
    assert waits[0] == waits[1] == 0 and min(waits[2], waits[3], waits[4]) >= 1


def test_cancel_frees_a_slot_and_dequeues(engine, variants):
    manager = KVCacheManager(engine, 1, MAX_NEW)
    scheduler = FrameScheduler(engine, manager, FixedK(1), max_prefill_batch=1)
    scheduler.step(
        [
            FrameInput(
                variants[0],
                requests=[TextRequest(1, MAX_NEW), TextRequest(2, MAX_NEW), TextRequest(3, MAX_NEW)],
            )
        ]
    )
    assert manager.cancel(3)  # queued
    assert manager.status(3) == RequestStatus.UNKNOWN and manager.queued == 1
    assert manager.cancel(1)  # running: slot freed at once
    assert manager.active == 0 and manager.status(1) == RequestStatus.UNKNOWN
    assert not manager.cancel(99)
    scheduler.step([])  # the queued request takes the freed slot
    assert manager.status(2) == RequestStatus.RUNNING


def test_invalid_request_is_refused(engine, variants):
    manager = KVCacheManager(engine, 2, MAX_NEW)
    cache = engine.prefill(inputs.observation_from_arrays(variants[0], engine.config))
    with pytest.raises(ValueError, match="max_new_tokens"):
        manager.submit(TextRequest(0, MAX_NEW + 1), cache, 0, 0)


def test_engine_implements_the_engine_contract(engine):
    assert isinstance(engine, api.EngineAPI)


def test_deadline_k_fills_the_frame_budget():
    policy = DeadlineK(target_hz=50, max_k=30, margin=0.9)
    assert policy.choose() == 1  # nothing measured yet
    for k in (1, 4, 8):  # decode(k) = 2 ms + 1 ms per step; actions take 10 ms
        policy.observe_action(action_s=0.010)
        policy.observe_decode(k, decode_s=0.002 + 0.001 * k)
    fixed, per_step = policy.cost.line()
    assert fixed == pytest.approx(0.002) and per_step == pytest.approx(0.001)
    assert policy.choose() == 6  # 0.9 * 20 ms - 10 ms - 2 ms = 6 ms of steps
    slow = dataclasses.replace(policy, target_hz=200)
    slow.observe_action(action_s=0.010)
    slow.observe_decode(1, decode_s=0.003)
    assert slow.choose() == 1  # the action path alone overruns: language still moves one token


def test_delay_bound_k_keeps_a_chunk_within_a_tenth_of_the_action_path():
    policy = DelayBoundK(max_k=30)
    assert policy.choose() == 1  # nothing measured yet
    for k in (1, 4, 8):  # decode(k) = 1 ms + 0.5 ms per step
        policy.observe_decode(k, decode_s=0.001 + 0.0005 * k)
    assert policy.choose() == 1  # no action path measured: no budget yet
    policy.observe_action(action_s=0.060)
    assert policy.delay_budget_s == pytest.approx(0.006)
    assert policy.choose() == 10  # (6 ms - 1 ms) / 0.5 ms
    assert DelayBoundK(max_k=30, max_delay_s=0.003).choose() == 1  # unmeasured: one step
    fixed = DelayBoundK(max_k=8, max_delay_s=0.020)
    fixed.observe_decode(2, 0.002)
    assert fixed.choose() == 8  # capped by max_k


def test_warmup_sizes_the_state_to_the_robots_prefix(engine, variants):
    """Row 1 of the golden batch masks a camera: its robot's state needs 256 prefix columns fewer."""
    manager = KVCacheManager(engine, 2, MAX_NEW)
    scheduler = FrameScheduler(engine, manager, FixedK(2), max_prefill_batch=1)
    full_bytes = manager.state_bytes
    scheduler.warmup(variants[1])
    assert manager.prefix_len == engine.config.prefix_len - engine.config.image_tokens
    assert manager.state.kv_valid.shape == (2, manager.prefix_len + MAX_NEW)
    assert manager.state_bytes < full_bytes
    result = scheduler.step([FrameInput(variants[1], requests=[TextRequest(0, MAX_NEW)])])
    assert result.actions and manager.active == 1
    with pytest.raises(ValueError, match="does not fit the batch state"):  # all three cameras: too wide
        scheduler.step([FrameInput(variants[0], requests=[TextRequest(1, MAX_NEW)])])


def test_deadline_k_warns_once_when_the_target_is_out_of_reach(caplog):
    """Actions take 10 ms and one decode step 3 ms: 200 Hz (5 ms) cannot be held, about 77 Hz can."""
    policy = DeadlineK(target_hz=200, max_k=30)
    with caplog.at_level(logging.WARNING, logger="oxygen_jax.runtime.k_policy"):
        for _ in range(10):
            policy.observe_action(action_s=0.010)
            policy.observe_decode(policy.choose(), decode_s=0.003)
    [record] = caplog.records
    assert "target rate 200 Hz is out of reach" in record.message
    assert "a frame takes 13.0 ms" in record.message and "at most 76.9 Hz; running at k=1" in record.message


def test_deadline_k_is_silent_for_a_reachable_target(caplog):
    policy = DeadlineK(target_hz=50, max_k=30)
    with caplog.at_level(logging.WARNING, logger="oxygen_jax.runtime.k_policy"):
        for _ in range(10):
            policy.observe_action(action_s=0.010)
            policy.observe_decode(policy.choose(), decode_s=0.003)
    assert not caplog.records
