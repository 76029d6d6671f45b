"""Counts XLA compilations, so tests and benchmarks can prove steady state never recompiles."""

import threading

import jax

_EVENT = "/jax/core/compile/backend_compile_duration"


class _Tally:
    lock = threading.Lock()
    total = 0
    registered = False


def _listener(event: str, _duration: float, **_kwargs) -> None:
    if event == _EVENT:
        with _Tally.lock:
            _Tally.total += 1


def compilations() -> int:
    """Backend compilations so far in this process (the listener is installed on first call)."""
    with _Tally.lock:
        if not _Tally.registered:
            jax.monitoring.register_event_duration_secs_listener(_listener)
            _Tally.registered = True
        return _Tally.total


class CompileCounter:
    """`with CompileCounter() as c: ...; c.count` = compilations inside the block."""

    def __enter__(self) -> "CompileCounter":
        self._start = compilations()
        self.count = 0
        return self

    def __exit__(self, *exc) -> None:
        self.count = compilations() - self._start
