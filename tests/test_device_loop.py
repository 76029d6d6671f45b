"""The device loop: observations preempt language, language fills idle time, nothing spins or compiles."""

import threading
import time

import numpy as np
import pytest
from conftest import golden_inputs

from oxygen_jax.engine.compile_counter import CompileCounter
from oxygen_jax.engine.engine import Engine
from oxygen_jax.models import inputs
from oxygen_jax.runtime.device_loop import DeviceLoop, ObservationWork
from oxygen_jax.runtime.k_policy import DelayBoundK, FixedK
from oxygen_jax.runtime.manager import KVCacheManager
from oxygen_jax.runtime.output import OutputStage, OutputThread
from oxygen_jax.runtime.requests import TextRequest
from oxygen_jax.runtime.scheduler import FrameInput, FrameScheduler

pytestmark = pytest.mark.timeout(120)

MAX_NEW = 8


@pytest.fixture(scope="module")
def engine(golden_params, tiny_config):
    return Engine(golden_params, tiny_config, eos_id=-1)  # no early stop: every request runs MAX_NEW


@pytest.fixture(scope="module")
def example(model_io):
    return {k: v[:1] for k, v in golden_inputs(model_io).items() if k != "noise"}


def _noise(seed: int, config) -> np.ndarray:
    shape = (1, config.action_horizon, config.action_dim)
    return np.random.default_rng(seed).standard_normal(shape, np.float32)


class _Recorder(FrameScheduler):
    """A frame scheduler that logs what the device does, in order."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.events: list[str] = []
        self.on_chunk = lambda chunks: None  # called on the device thread as each chunk starts

    def act(self, frame_inputs):
        self.events.append(f"act{len(frame_inputs)}")
        return super().act(frame_inputs)

    def advance(self, k):
        self.events.append("chunk")
        self.on_chunk(self.events.count("chunk"))
        chunk = super().advance(k)
        self.events.append("chunk_end")
        return chunk


def _loop(engine, example, *, mode="async", k_policy=None, max_batch=2, slots=4, **kwargs) -> DeviceLoop:
    manager = KVCacheManager(engine, slots, MAX_NEW)
    scheduler = _Recorder(engine, manager, FixedK(1), max_prefill_batch=max_batch)
    scheduler.warmup(example)
    scheduler.k_policy = k_policy or FixedK(2)
    scheduler.events.clear()
    output = OutputThread(OutputStage())
    output.start()
    return DeviceLoop(scheduler, output, mode=mode, **kwargs)


def _stop(loop: DeviceLoop) -> None:
    """Stops the device thread, then the output thread once it delivered everything."""
    loop.stop()
    loop.output.stop()


class _Robot:
    """Collects one observation's reply and its language request's tokens, with the order they came in."""

    def __init__(self, log: list[str], name: str):
        self.log, self.name = log, name
        self.replied = threading.Event()
        self.done = threading.Event()
        self.reply = None
        self.tokens: list[int] = []
        self.result = None

    def request(self, request_id: int) -> TextRequest:
        return TextRequest(request_id, MAX_NEW, on_tokens=self._on_tokens, on_done=self._on_done)

    def on_reply(self, reply) -> None:
        self.log.append(f"reply:{self.name}")
        self.reply = reply
        self.replied.set()

    def _on_tokens(self, _request_id, tokens, _text) -> None:
        self.log.append(f"tokens:{self.name}")
        self.tokens.extend(tokens.tolist())

    def _on_done(self, result) -> None:
        self.result = result
        self.done.set()


def _alone(engine, example, noise):
    """Actions and greedy text of one observation computed on its own (no loop, no batch state)."""
    cache = engine.prefill(inputs.observation_from_arrays(example, engine.config))
    actions = np.asarray(engine.denoise(cache, noise, 10))[0]
    text = np.asarray(engine.generate(cache, MAX_NEW).tokens)[0]
    return actions, text


def test_reply_leaves_before_language_and_language_advances_while_idle(engine, example):
    loop = _loop(engine, example).start()
    log: list[str] = []
    robot = _Robot(log, "a")
    noise = _noise(0, engine.config)
    loop.submit(ObservationWork(FrameInput(example, noise, [robot.request(0)]), robot.on_reply))
    assert robot.done.wait(30), "language never finished although the device was idle"
    _stop(loop)
    assert log[0] == "reply:a" and log.count("reply:a") == 1  # actions first, then the text streams
    assert loop.scheduler.events[0] == "act1" and "chunk" not in loop.scheduler.events[:1]
    actions, text = _alone(engine, example, noise)
    np.testing.assert_allclose(robot.reply.actions, actions, atol=1e-5)  # same noise: same actions
    np.testing.assert_array_equal(robot.result.tokens, text)  # greedy text equals decoding it alone
    assert robot.tokens == text.tolist()  # the stream adds up to the final text
    assert loop.stats.chunks == MAX_NEW // 2  # FixedK(2): four chunks, no observation waited


def test_an_observation_arriving_during_a_chunk_waits_only_for_that_chunk(engine, example):
    loop = _loop(engine, example, k_policy=FixedK(1)).start()
    log: list[str] = []
    first, second = _Robot(log, "first"), _Robot(log, "second")

    def arrive_during_chunk(chunks: int) -> None:
        if chunks == 2:
            loop.submit(ObservationWork(FrameInput(example, _noise(1, engine.config)), second.on_reply))

    loop.scheduler.on_chunk = arrive_during_chunk
    request = TextRequest(0, MAX_NEW, on_tokens=first._on_tokens, on_done=first._on_done)
    loop.submit(ObservationWork(FrameInput(example, _noise(0, engine.config), [request]), first.on_reply))
    assert first.done.wait(30) and second.replied.wait(30)
    _stop(loop)
    events = loop.scheduler.events
    # act, chunk 1, chunk 2 (the arrival), then the observation before any further chunk.
    assert events[:6] == ["act1", "chunk", "chunk_end", "chunk", "chunk_end", "act1"]
    assert events[6:] == ["chunk", "chunk_end"] * (MAX_NEW - 2)


def test_frame_mode_replies_after_the_frames_decode(engine, example):
    loop = _loop(engine, example, mode="frame").start()
    log: list[str] = []
    robots = [_Robot(log, str(i)) for i in range(3)]
    first = FrameInput(example, _noise(0, engine.config), [robots[0].request(0)])
    loop.submit(ObservationWork(first, robots[0].on_reply))
    assert robots[0].replied.wait(30)
    time.sleep(0.2)  # idle: the frame loop decodes only in frames
    assert loop.scheduler.events == ["act1", "chunk", "chunk_end"]
    for robot in robots[1:]:  # each further observation is one frame: decode(2) before its reply
        loop.submit(ObservationWork(FrameInput(example, _noise(1, engine.config)), robot.on_reply))
        assert robot.replied.wait(30)
    _stop(loop)
    assert loop.scheduler.events == ["act1", "chunk", "chunk_end"] * 3
    assert len(robots[0].tokens) == 6  # three frames of decode(2)


def test_idle_loop_blocks_instead_of_spinning(engine, example):
    loop = _loop(engine, example).start()
    time.sleep(0.3)
    idle_wakeups = loop.stats.wakeups
    robot = _Robot([], "a")
    loop.submit(ObservationWork(FrameInput(example, None, [robot.request(0)]), robot.on_reply))
    assert robot.done.wait(30)
    time.sleep(0.3)
    after = loop.stats.wakeups
    time.sleep(0.3)
    assert loop.stats.wakeups == after  # nothing to do: no wake-ups at all
    _stop(loop)
    assert idle_wakeups == 0 and after <= 2  # one wake-up per submit at most


def test_gathers_expected_senders_and_drains_on_stop(engine, example):
    loop = _loop(engine, example, gather_s=5.0, expected_senders=lambda: 2, max_batch=2).start()
    robots = [_Robot([], str(i)) for i in range(5)]
    loop.submit(ObservationWork(FrameInput(example), robots[0].on_reply, sender="x"))
    time.sleep(0.2)
    assert not robots[0].replied.is_set()  # waits for the second expected sender
    loop.submit(ObservationWork(FrameInput(example), robots[1].on_reply, sender="y"))
    assert robots[1].replied.wait(30) and robots[0].reply.batch == 2
    for robot in robots[2:]:  # one sender only: these would wait for the gather window...
        loop.submit(ObservationWork(FrameInput(example), robot.on_reply, sender="x"))
    _stop(loop)  # ...but stopping answers every observation already received
    assert all(robot.replied.is_set() and robot.reply.error is None for robot in robots)
    with pytest.raises(RuntimeError, match="shutting down"):
        loop.submit(ObservationWork(FrameInput(example), robots[0].on_reply))


def test_no_compilation_after_warmup_with_learned_chunks(engine, example):
    loop = _loop(engine, example, k_policy=DelayBoundK(max_k=MAX_NEW)).start()
    robots = [_Robot([], str(i)) for i in range(6)]
    with CompileCounter() as counter:
        for i, robot in enumerate(robots):
            loop.submit(ObservationWork(FrameInput(example, None, [robot.request(i)]), robot.on_reply))
            time.sleep(0.01 * (i % 3))
        assert all(robot.done.wait(30) for robot in robots)
        _stop(loop)
    assert counter.count == 0
    assert all(len(robot.result.tokens) == MAX_NEW for robot in robots)
