"""The output stage: host work on what the device produced, kept off the device thread.

The device thread only hands over raw results: `TokenEvent`s (a request's new token ids, and its result
once done) and each observation's action reply. `OutputStage` turns token events into callbacks:
it detokenizes every request's tokens incrementally (only the new tokens and the one before them are
decoded again, as vLLM's output processor and JetStream's detokenize thread do, instead of the whole text
on every chunk), fills a finished request's text and calls `on_tokens` / `on_done`. `OutputThread` runs
that work, and the replies, in the order the device produced them, on a thread of its own.
"""

import dataclasses
import logging
import queue
import threading
from collections.abc import Callable, Iterable

import numpy as np

from oxygen_jax.runtime.requests import TextResult, TokenEvent

logger = logging.getLogger(__name__)

Detokenize = Callable[[np.ndarray], str]


def token_ids_text(tokens: np.ndarray) -> str:
    """The text of a runtime without a tokenizer (benchmarks, tests): the ids, space separated."""
    return " ".join(map(str, np.asarray(tokens).tolist()))


class IncrementalDetokenizer:
    """One request's text, extended as tokens arrive.

    Each step decodes the new tokens together with the tokens of the previous step and keeps what they
    add to that previous step's text, so word boundaries (a SentencePiece piece's leading space) come out
    as the full text has them; a step that ends inside a multi-byte character waits for the next.
    """

    def __init__(self, detokenize: Detokenize):
        self._detokenize = detokenize
        self._tokens: list[int] = []
        self._prefix = 0  # start of the window decoded again
        self._read = 0  # end of the tokens whose text is in `text`
        self.text = ""

    def add(self, tokens: np.ndarray) -> str:
        """Appends new token ids; returns the text so far."""
        self._tokens.extend(np.asarray(tokens).tolist())
        before = self._detokenize(np.asarray(self._tokens[self._prefix : self._read], np.int64))
        after = self._detokenize(np.asarray(self._tokens[self._prefix :], np.int64))
        if len(after) > len(before) and not after.endswith("\ufffd"):
            self.text += after[len(before) :]
            self._prefix, self._read = self._read, len(self._tokens)
        return self.text


class OutputStage:
    """Detokenizes token events and runs the requests' callbacks; keeps text state only for requests in
    flight (a finished request's entry goes)."""

    def __init__(self, detokenize: Detokenize = token_ids_text):
        self._detokenize = detokenize
        self._texts: dict[int, IncrementalDetokenizer] = {}

    @property
    def tracked(self) -> int:
        """Requests whose text is being assembled."""
        return len(self._texts)

    def dispatch(self, event: TokenEvent) -> TextResult | None:
        """Streams the event's tokens (`on_tokens` with the text so far) and, once the request finished,
        its result with the text of all its tokens (`on_done`); returns that result."""
        request = event.request
        if len(event.tokens) and request.on_tokens is not None:  # text so far only for a listener
            texts = self._texts.setdefault(request.request_id, IncrementalDetokenizer(self._detokenize))
            _call(request.on_tokens, request.request_id, event.tokens, texts.add(event.tokens))
        if event.result is None:
            return None
        self._texts.pop(request.request_id, None)
        result = dataclasses.replace(event.result, text=self._detokenize(event.result.tokens))
        _call(request.on_done, result)
        return result

    def dispatch_all(self, events: Iterable[TokenEvent]) -> list[TextResult]:
        """Every event in order; the finished requests' results."""
        return [result for event in events if (result := self.dispatch(event)) is not None]


class OutputThread:
    """Runs pushed work (token events, replies) in push order on its own thread."""

    def __init__(self, stage: OutputStage):
        self.stage = stage
        self._queue: queue.SimpleQueue[Callable[[], object] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="runtime-output", daemon=True)
        self._thread.start()

    def push_events(self, events: list[TokenEvent]) -> None:
        """Device thread: hands over a chunk's events (nothing else happens there)."""
        if events:
            self._queue.put(lambda: self.stage.dispatch_all(events))

    def push(self, work: Callable[[], object]) -> None:
        self._queue.put(work)

    def flush(self, timeout: float | None = None) -> bool:
        """Waits until everything pushed before this call ran; False on timeout."""
        done = threading.Event()
        self._queue.put(done.set)
        return done.wait(timeout)

    def stop(self) -> None:
        """Runs what is queued, then ends the thread."""
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None

    def _run(self) -> None:
        while (work := self._queue.get()) is not None:
            try:
                work()
            except Exception:
                logger.exception("output work failed")


def _call(callback: Callable | None, *args: object) -> None:
    if callback is None:
        return
    try:
        callback(*args)
    except Exception:
        logger.exception("a request callback failed")
