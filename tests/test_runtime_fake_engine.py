"""The KV cache manager and the frame scheduler over the fake engine: admission, queueing, streaming,
cancellation and the frame loop, with outputs computed by hand (tests/fake_engine.py says how)."""

import threading

import numpy as np
import pytest
from fake_engine import FakeEngine

from oxygen_jax.engine import api
from oxygen_jax.models import inputs
from oxygen_jax.runtime import runtime
from oxygen_jax.runtime.device_loop import ObservationWork
from oxygen_jax.runtime.k_policy import FixedK
from oxygen_jax.runtime.manager import KVCacheManager
from oxygen_jax.runtime.output import OutputStage, token_ids_text
from oxygen_jax.runtime.requests import RequestStatus, TextRequest
from oxygen_jax.runtime.runtime import Runtime, RuntimeConfig
from oxygen_jax.runtime.scheduler import FrameInput, FrameScheduler

MAX_NEW = 6


@pytest.fixture
def engine(tiny_config):
    return FakeEngine(tiny_config)


def _arrays(config, prompt_len: int) -> dict:
    """One observation (batch dim 1) whose prompt has `prompt_len` valid tokens."""
    return inputs.synthetic_arrays(config, prompt_len=prompt_len)


def _cache(engine, *prompt_lens: int):
    """A prefix cache with one row per prompt length."""
    rows = [_arrays(engine.config, n) for n in prompt_lens]
    arrays = {key: np.concatenate([row[key] for row in rows]) for key in rows[0]}
    return engine.prefill(inputs.observation_from_arrays(arrays, engine.config))


def _run_until_idle(manager: KVCacheManager, k: int = 1) -> list:
    """The finished requests' results (text as the output stage fills it), in finishing order."""
    results, frame, stage = [], 0, OutputStage(token_ids_text)
    while manager.active or manager.queued:
        manager.admit(frame)
        manager.decode(k)
        results += stage.dispatch_all(manager.harvest(frame))
        frame += 1
    return results


def test_fake_engine_implements_the_runtime_contract(engine):
    assert isinstance(engine, api.RuntimeEngine)


def test_insert_columns_pad_to_the_cache_rows_and_drop_the_padding():
    inserts = [api.SlotInsert(2, 5, api.SamplingParams(0.7, 0.9, 11)), api.SlotInsert(0, 3)]
    columns = api.insert_columns(inserts, rows=4, max_slots=8)
    np.testing.assert_array_equal(columns["slots"], [2, 0, 8, 8])
    np.testing.assert_array_equal(columns["max_new"], [5, 3, 1, 1])
    np.testing.assert_allclose(columns["temperature"], [0.7, 0.0, 0.0, 0.0])
    np.testing.assert_allclose(columns["top_p"], [0.9, 1.0, 1.0, 1.0])
    np.testing.assert_array_equal(columns["seeds"], [11, 0, 0, 0])
    with pytest.raises(ValueError, match="3 inserts for a prefix cache of 2 rows"):
        api.insert_columns([*inserts, inserts[0]], rows=2, max_slots=8)


def test_text_counts_up_from_the_prefix_length_until_its_limit(engine):
    manager = KVCacheManager(engine, max_slots=2, max_new_tokens=MAX_NEW)
    manager.submit(TextRequest(0, 3), _cache(engine, 5), row=0, frame=0)
    (result,) = _run_until_idle(manager)
    np.testing.assert_array_equal(result.tokens, [5, 6, 7])
    np.testing.assert_array_equal(result.logprobs, [-1.0, -1.0, -1.0])
    assert result.finish_reason == "length" and result.text == "5 6 7"


def test_text_stops_at_eos(tiny_config):
    engine = FakeEngine(tiny_config, eos_id=6)
    manager = KVCacheManager(engine, max_slots=2, max_new_tokens=MAX_NEW)
    manager.submit(TextRequest(0, MAX_NEW), _cache(engine, 4), row=0, frame=0)
    (result,) = _run_until_idle(manager)
    np.testing.assert_array_equal(result.tokens, [4, 5, 6])
    assert result.finish_reason == "eos"


def test_requests_on_one_cache_go_in_one_bucketed_insert_in_fifo_order(engine):
    """Three rows of one cache: one insert of a 4-row bucket, slots taken in order of submission."""
    manager = KVCacheManager(engine, max_slots=4, max_new_tokens=MAX_NEW)
    cache = _cache(engine, 3, 7, 9)
    for request_id, row in ((10, 2), (11, 0), (12, 1)):
        manager.submit(TextRequest(request_id, MAX_NEW), cache, row=row, frame=0)
    engine.calls.clear()
    manager.admit(frame=0)
    assert engine.calls == [("insert", 4)]
    assert manager.active == 3 and manager.queued == 0
    np.testing.assert_array_equal(
        manager.state.next_pos[:3], [9, 3, 7]
    )  # each slot starts at its row's length
    assert not manager.state.active[3]  # the padding row went into no slot


def test_requests_from_two_frames_insert_once_per_cache_and_decode_together(engine):
    manager = KVCacheManager(engine, max_slots=4, max_new_tokens=MAX_NEW)
    manager.submit(TextRequest(0, 2), _cache(engine, 3), row=0, frame=0)
    manager.submit(TextRequest(1, 2), _cache(engine, 10), row=0, frame=1)
    engine.calls.clear()
    results = _run_until_idle(manager, k=2)
    assert engine.calls[:3] == [("insert", 1), ("insert", 1), ("decode", 2)]
    assert {r.request_id: r.tokens.tolist() for r in results} == {0: [3, 4], 1: [10, 11]}


def test_more_requests_than_slots_queue_fifo_and_reuse_freed_slots(engine):
    manager = KVCacheManager(engine, max_slots=2, max_new_tokens=MAX_NEW)
    cache = _cache(engine, 1, 2, 3, 4, 5)
    for i in range(5):
        manager.submit(TextRequest(i, 2), cache, row=i, frame=0)
    manager.admit(frame=0)
    assert [manager.status(i) for i in range(5)] == [RequestStatus.RUNNING] * 2 + [RequestStatus.QUEUED] * 3
    results = _run_until_idle(manager)
    assert [r.request_id for r in results] == [0, 1, 2, 3, 4]
    assert [r.tokens.tolist() for r in results] == [[1, 2], [2, 3], [3, 4], [4, 5], [5, 6]]
    assert [r.queue_wait_frames for r in results] == [0, 0, 2, 2, 4]
    assert manager.active == 0 and manager.state.active.sum() == 0


def test_queued_requests_keep_only_their_own_row_of_the_frame_cache(engine):
    manager = KVCacheManager(engine, max_slots=1, max_new_tokens=MAX_NEW)
    cache = _cache(engine, 2, 8, 5)
    for i in range(3):
        manager.submit(TextRequest(i, 1), cache, row=i, frame=0)
    manager.admit(frame=0)
    queued = list(manager._queue)
    assert [p.cache.mask.shape[0] for p in queued] == [1, 1] and [p.row for p in queued] == [0, 0]
    assert [r.tokens.tolist() for r in _run_until_idle(manager)] == [[2], [8], [5]]


def test_streaming_delivers_every_token_once_across_decode_chunks(engine):
    """The manager hands over raw token ids only; the output stage streams them with the text so far."""
    streamed, done = [], []
    stage = OutputStage(token_ids_text)
    manager = KVCacheManager(engine, max_slots=2, max_new_tokens=MAX_NEW)
    request = TextRequest(
        0, 5, on_tokens=lambda _, tokens, text: streamed.append((tokens.tolist(), text)), on_done=done.append
    )
    manager.submit(request, _cache(engine, 20), row=0, frame=0)
    manager.admit(frame=0)
    for k in (2, 0, 2, 3):
        manager.decode(k)
        events = manager.harvest(frame=1)
        assert all(event.result is None or event.result.text == "" for event in events)
        stage.dispatch_all(events)
    assert streamed == [([20, 21], "20 21"), ([22, 23], "20 21 22 23"), ([24], "20 21 22 23 24")]
    assert [(r.tokens.tolist(), r.text) for r in done] == [([20, 21, 22, 23, 24], "20 21 22 23 24")]
    assert manager.tokens_generated == 5 and stage.tracked == 0


def test_cancel_dequeues_or_frees_the_slot_at_once(engine):
    done = []
    manager = KVCacheManager(engine, max_slots=1, max_new_tokens=MAX_NEW)
    cache = _cache(engine, 3, 3, 3)
    for i in range(3):
        manager.submit(TextRequest(i, MAX_NEW, on_done=done.append), cache, row=i, frame=0)
    manager.admit(frame=0)
    manager.decode(2)
    stage = OutputStage(token_ids_text)
    stage.dispatch(manager.cancel(2))  # queued
    stage.dispatch(manager.cancel(0))  # running: keeps what it generated
    assert manager.cancel(99) is None
    assert [(r.request_id, r.tokens.tolist(), r.finish_reason) for r in done] == [
        (2, [], "cancelled"),
        (0, [3, 4], "cancelled"),
    ]
    assert manager.active == 0 and manager.queued == 1
    manager.admit(frame=1)
    assert manager.status(1) == RequestStatus.RUNNING


def test_submit_refuses_what_cannot_run(engine):
    manager = KVCacheManager(engine, max_slots=2, max_new_tokens=MAX_NEW)
    cache = _cache(engine, 3)
    with pytest.raises(ValueError, match="max_new_tokens must lie in"):
        manager.submit(TextRequest(0, MAX_NEW + 1), cache, row=0, frame=0)
    manager.submit(TextRequest(1, 2), cache, row=0, frame=0)
    with pytest.raises(ValueError, match="already in flight"):
        manager.submit(TextRequest(1, 2), cache, row=0, frame=0)
    with pytest.raises(RuntimeError, match="empty manager"):
        manager.fit_prefix(8)


def test_a_prefix_longer_than_the_fitted_state_is_refused(engine):
    manager = KVCacheManager(engine, max_slots=2, max_new_tokens=MAX_NEW)
    manager.fit_prefix(16)
    assert manager.state.kv_valid.shape == (2, 16 + MAX_NEW)
    with pytest.raises(ValueError, match="does not fit the batch state's 16"):
        manager.submit(TextRequest(0, 2), _cache(engine, 3), row=0, frame=0)


def test_frame_actions_come_one_per_input_in_order_from_one_padded_prefill(engine):
    scheduler = FrameScheduler(engine, KVCacheManager(engine, 2, MAX_NEW), FixedK(1), num_steps=7)
    shape = (1, engine.config.action_horizon, engine.config.action_dim)
    frame_inputs = [FrameInput(_arrays(engine.config, 4), noise=np.full(shape, float(i))) for i in range(3)]
    result = scheduler.step(frame_inputs)
    assert engine.calls[:2] == [("prefill", 4), ("denoise", 4)]  # 3 inputs padded to a bucket of 4
    for i, actions in enumerate(result.actions):
        np.testing.assert_array_equal(actions, np.full(shape[1:], i + 7.0))
    assert result.frame == 0 and result.k == 0 and result.finished == []


def test_frame_loop_decodes_k_tokens_per_frame_and_finishes_requests(engine):
    scheduler = FrameScheduler(engine, KVCacheManager(engine, 2, MAX_NEW), FixedK(2), max_prefill_batch=1)
    first = scheduler.step([FrameInput(_arrays(engine.config, 9), requests=[TextRequest(0, 5)])])
    assert (first.k, first.decode_batch, first.new_tokens) == (2, 1, 2)
    results = [scheduler.step([]) for _ in range(2)]
    assert [r.new_tokens for r in results] == [2, 1]
    (finished,) = results[-1].finished
    assert finished.tokens.tolist() == [9, 10, 11, 12, 13]
    assert (finished.arrival_frame, finished.admitted_frame, finished.finished_frame) == (0, 0, 2)


def test_warmup_fits_the_state_to_the_robots_prefix_and_leaves_everything_empty(engine):
    manager, k_policy = KVCacheManager(engine, 2, MAX_NEW), FixedK(3)
    scheduler = FrameScheduler(engine, manager, k_policy, max_prefill_batch=2)
    scheduler.warmup(_arrays(engine.config, 5))
    assert manager.prefix_len == engine.config.max_token_len
    assert manager.active == manager.queued == 0 and scheduler.frame == 0
    assert scheduler.k_policy is k_policy
    inserts = sorted({n for name, n in engine.calls if name == "insert"})
    assert inserts == [1, 2] and ("prefill", 2) in engine.calls  # every insert and prefill bucket


def _served(engine, k: int, **config) -> Runtime:
    return runtime.build(
        engine, RuntimeConfig(max_slots=2, max_new_tokens=MAX_NEW, k=k, max_prefill_batch=1, **config)
    )


def test_device_loop_replies_before_any_decode_then_finishes_the_text_while_idle(engine):
    served = _served(engine, 2, loop="async", max_delay_s=1.0).start()
    replies, results, done = [], [], threading.Event()
    request = TextRequest(0, 5, on_done=lambda result: (results.append(result), done.set()))
    shape = (1, engine.config.action_horizon, engine.config.action_dim)
    work = FrameInput(_arrays(engine.config, 7), noise=np.zeros(shape), requests=[request])
    served.submit(ObservationWork(work, lambda reply: replies.append((reply, list(engine.calls)))))
    assert done.wait(10), "the text never finished although the device was idle"
    served.stop()
    ((reply, calls_at_reply),) = replies
    np.testing.assert_array_equal(reply.actions, np.full(shape[1:], 10.0))  # noise 0 + 10 steps
    assert calls_at_reply[:2] == [("prefill", 1), ("denoise", 1)]  # the actions left before any language
    assert results[0].tokens.tolist() == [7, 8, 9, 10, 11] and results[0].text == "7 8 9 10 11"


def test_device_loop_owed_chunk_between_batches_takes_owed_k_then_the_policy_decides(engine):
    """With no idle time (robots calling back to back) the chunk owed between two batches is what the frame
    loop would decode (`owed_k`); idle-time chunks take the k policy's size."""
    served = _served(engine, 4, loop="frame", owed_k=1)
    assert isinstance(served.k_policy, FixedK)
    served = _served(engine, 4, loop="async", owed_k=1, max_delay_s=1.0).start()
    done = threading.Event()
    request = TextRequest(0, MAX_NEW, on_done=lambda result: done.set())
    shape = (1, engine.config.action_horizon, engine.config.action_dim)
    work = FrameInput(_arrays(engine.config, 7), noise=np.zeros(shape), requests=[request])
    served.submit(ObservationWork(work, lambda reply: None))
    assert done.wait(10), "the text never finished although the device was idle"
    served.stop()
    decodes = [call for call in engine.calls if call[0] == "decode"]
    assert decodes[0] == ("decode", 1)  # the owed chunk, then the delay bound's choice
    assert sum(k for _, k in decodes) >= MAX_NEW
    with pytest.raises(ValueError, match="owed_k must be >= 1"):
        RuntimeConfig(max_slots=2, max_new_tokens=MAX_NEW, owed_k=0)


def test_finished_requests_leave_the_managers_tables_over_a_hundred_thousand_requests(engine):
    """A server that runs for a week must not grow: after every frame the manager tracks only what is
    queued or running, never more than the slots plus the admission queue, and none of it once idle."""
    slots, per_frame, total = 4, 6, 100_000
    manager = KVCacheManager(engine, max_slots=slots, max_new_tokens=MAX_NEW)
    cache = _cache(engine, *range(1, per_frame + 1))
    submitted, finished, most_tracked, frame = 0, 0, 0, 0
    while submitted < total or manager.active or manager.queued:
        for row in range(min(per_frame, total - submitted) if manager.queued < slots else 0):
            manager.submit(TextRequest(submitted, 1 + submitted % 2), cache, row=row, frame=frame)
            submitted += 1
        manager.admit(frame)
        most_tracked = max(most_tracked, manager.tracked)
        manager.decode(2)
        finished += sum(event.result is not None for event in manager.harvest(frame))
        assert manager.tracked == manager.active + manager.queued <= 2 * slots + per_frame
        frame += 1
    assert finished == submitted == total
    assert manager.tracked == 0 and manager.status(total - 1) == RequestStatus.UNKNOWN
    assert most_tracked > slots  # the queue was in use, so the bound was exercised
