"""The runtime's output stage: incremental detokenizing equals the whole text, host work runs on the
output thread (never the device's), results arrive in device order, and finished requests leave its table."""

import threading

import numpy as np
import pytest
from conftest import GOLDEN
from fake_engine import FakeEngine

from oxygen_jax.models import inputs
from oxygen_jax.runtime import runtime
from oxygen_jax.runtime.device_loop import ObservationWork
from oxygen_jax.runtime.output import IncrementalDetokenizer
from oxygen_jax.runtime.requests import TextRequest
from oxygen_jax.runtime.runtime import RuntimeConfig
from oxygen_jax.runtime.scheduler import FrameInput
from oxygen_jax.tokenizer import Tokenizer

MAX_NEW = 6


@pytest.fixture(scope="module")
def tokenizer():
    return Tokenizer(GOLDEN / "tokenizer" / "tiny_paligemma_standin.model", max_len=48)


@pytest.mark.parametrize("chunk", [1, 2, 3, 7])
def test_incremental_text_equals_the_whole_texts_detokenizing_at_every_step(tokenizer, chunk):
    """Words, their spaces and multi-piece words come out as detokenizing all tokens at once gives them."""
    sentence = "pick up the black bowl, then place it on the plate (carefully) near 42 cups"
    ids = np.asarray(tokenizer._sp.encode(sentence), np.int32)
    texts = IncrementalDetokenizer(tokenizer.detokenize)
    for end in range(chunk, len(ids) + chunk, chunk):
        text = texts.add(ids[end - chunk : end])
        assert text == tokenizer.detokenize(ids[:end])
    assert text == sentence


@pytest.fixture
def engine(tiny_config):
    return FakeEngine(tiny_config)


def _observation(engine, prompt_len: int, requests: list[TextRequest]) -> FrameInput:
    shape = (1, engine.config.action_horizon, engine.config.action_dim)
    arrays = inputs.synthetic_arrays(engine.config, prompt_len=prompt_len)
    return FrameInput(arrays, noise=np.zeros(shape), requests=requests)


def test_replies_and_callbacks_run_on_the_output_thread_in_device_order(engine):
    served = runtime.build(
        engine, RuntimeConfig(max_slots=2, max_new_tokens=MAX_NEW, loop="frame", k=2, max_prefill_batch=1)
    )
    log, replied = [], threading.Event()

    def note(what: str):
        return lambda *_: log.append((what, threading.current_thread().name))

    def reply(*_) -> None:
        note("reply")()
        replied.set()

    request = TextRequest(0, 4, on_tokens=note("tokens"), on_done=note("done"))
    served.submit(ObservationWork(_observation(engine, 5, [request]), reply))
    assert replied.wait(10)
    served.submit(ObservationWork(_observation(engine, 5, []), reply))
    served.stop()
    # Frame loop, k=2: the first frame's tokens precede its reply; the second frame finishes the request.
    assert [what for what, _ in log] == ["tokens", "reply", "tokens", "done", "reply"]
    assert {thread for _, thread in log} == {"runtime-output"}


def test_the_output_stage_keeps_nothing_of_finished_requests(engine):
    served = runtime.build(
        engine, RuntimeConfig(max_slots=2, max_new_tokens=MAX_NEW, loop=None, k=2, max_prefill_batch=1)
    )
    streamed = []
    for i in range(50):
        request = TextRequest(i, 1 + i % MAX_NEW, on_tokens=lambda _, tokens, text: streamed.append(text))
        served.step([_observation(engine, 3, [request])])
        assert served.output_tracked <= served.manager.max_slots + served.manager.queued
    while served.manager.active or served.manager.queued:
        served.step([])
    assert served.output_tracked == 0 and served.manager.tracked == 0 and streamed
