"""Attacks on the server's bounds by bytes and by rate, for `probe_isolation.py` (after `stall_attacks.py`'s).

Each is sized by `scale` (1: the recorded figures' sizes; tests pass less):
- `rtc control_hz inf after a chunk` and `1x5000x3 image`: inputs that used to be server faults;
- `4 x 15 MB requests pipelined, never read`: four connections each send requests of 15 MB back to back and
  never read a reply (the server's memory must stay bounded by its byte limits, not its frame counts);
- `flood of tiny bad messages`: a client sends undecodable bytes as fast as it can, connecting again each
  time the server closes it (rate-limited, closed, then refused at the handshake, and logged once per
  interval: the server's log must not grow with it);
- `wrong API keys`: one address guesses keys as fast as it can (throttled to a few a second);
- `300 handshakes at once`: a burst of new robots (admitted at a bounded rate, so served robots keep
  their pace);
- `kept_sending_at_shutdown`: SIGTERM while robots keep sending; every request is answered, refused in
  one line or meets the server's close with its reason, and the server exits within its drain timeout.
"""

import concurrent.futures
import dataclasses
import os
import pathlib
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from hostile_probe import (
    Attack,
    Headers,
    Outcome,
    closed_outcome,
    connect,
    fault_attack,
    reply_outcome,
)  # scripts/, beside this script
from websockets.exceptions import ConnectionClosed, InvalidStatus

from oxygen_jax.serving import msgpack_numpy

MB = 10**6
# How long an address that failed API keys waits for its next try (the server's FAILED_KEY_RATE is 1/s).
THROTTLE_S = 1.5


def bound_attacks(
    base: dict[str, Any], *, scale: float = 1.0, log: pathlib.Path | None = None
) -> dict[str, Attack]:
    """Name -> attack; `base` is a valid observation of the robot, `log` the server's log file (the flood
    reports how much it grew)."""
    size = int(15 * MB * scale)
    big = msgpack_numpy.packb(base | {"junk": np.zeros(size, np.uint8)})
    rtc_inf = {"executed": 2, "delay": 1, "control_hz": float("inf")}
    seconds = max(1.0, 5.0 * scale)
    return {
        **_after_a_chunk("rtc control_hz inf after a chunk", base, base | {"rtc": rtc_inf}),
        "1x5000x3 image": fault_attack(lambda ws: ws.send(msgpack_numpy.packb(_elongated(base)))),
        f"4 x {size / MB:g} MB requests pipelined, never read": _pipelined(big, connections=4, each=8),
        f"flood of tiny bad messages for {seconds:g} s": _flood(b"\xc1", seconds, log),
        f"{int(300 * min(1.0, 4 * scale))} handshakes at once": _handshakes(int(300 * min(1.0, 4 * scale))),
        f"wrong API keys for {seconds:g} s": _guess_keys(seconds),  # last: it leaves this address throttled
    }


def _elongated(base: dict[str, Any]) -> dict[str, Any]:
    """`base` with its first image 1x5000 pixels (a resize to 224x224 would give it height 0)."""
    images = [k for k, v in base.items() if isinstance(v, np.ndarray) and v.dtype == np.uint8 and v.ndim == 3]
    key = images[0]
    channels_first = base[key].shape[0] == 3
    return base | {key: np.zeros((3, 1, 5000) if channels_first else (1, 5000, 3), np.uint8)}


def _after_a_chunk(name: str, first: dict[str, Any], second: dict[str, Any]) -> dict[str, Attack]:
    """Two attacks on one connection: `first` served (its chunk read), then `name`: `second` sent, whose
    answer is the outcome; so the served request's share of the healthy robot's batch is not the refused
    one's row. Run alone (`--only`), the second takes its own chunk first."""
    held: list[Any] = []

    def take_a_chunk(websocket: Any) -> None:
        websocket.send(msgpack_numpy.packb(first))
        websocket.recv(timeout=120)

    def chunk(url: str, headers: Headers) -> Outcome:
        websocket = connect(url, headers)
        websocket.recv(timeout=30)  # metadata
        take_a_chunk(websocket)
        held.append(websocket)
        return Outcome("answered", "a chunk, on the connection the next attack uses")

    def send_second(websocket: Any) -> None:
        websocket.send(msgpack_numpy.packb(second))

    def take_a_chunk_then_send_second(websocket: Any) -> None:
        take_a_chunk(websocket)
        send_second(websocket)

    def then(url: str, headers: Headers) -> Outcome:
        if not held:
            return fault_attack(take_a_chunk_then_send_second)(url, headers)
        with held.pop() as websocket:
            try:
                send_second(websocket)
                return reply_outcome(websocket.recv(timeout=120))
            except ConnectionClosed as error:
                return closed_outcome(error)

    return {f"{name.removesuffix(' after a chunk')}: the first chunk": chunk, name: then}


def _pipelined(message: bytes, *, connections: int, each: int, hold_s: float = 3.0) -> Attack:
    """`connections` robots each send `message` `each` times back to back without reading, hold for
    `hold_s`, then drop the connection; says how many bytes the server took before it stopped reading."""

    def run(url: str, headers: Headers) -> Outcome:
        sockets = [connect(url, headers) for _ in range(connections)]
        for websocket in sockets:
            websocket.recv(timeout=30)  # metadata
        sent = [0] * connections

        def send_all(i: int) -> None:
            try:
                for _ in range(each):
                    sockets[i].send(message)
                    sent[i] += 1
            except (ConnectionClosed, OSError):
                pass

        threads = [threading.Thread(target=send_all, args=(i,), daemon=True) for i in range(connections)]
        for thread in threads:
            thread.start()
        time.sleep(hold_s)
        for websocket in sockets:  # a sender blocked by backpressure is cut off with its socket
            websocket.socket.close()
        for thread in threads:
            thread.join(timeout=10)
        mb = len(message) / MB
        return Outcome(
            "closed",
            f"{sum(sent)} of {connections * each} messages of {mb:.0f} MB fully sent in {hold_s:g} s "
            f"(per connection {sent}); then dropped unread",
        )

    return run


@dataclasses.dataclass
class _Counts:
    sent: int = 0
    refused: int = 0
    other: int = 0


def _flood(message: bytes, seconds: float, log: pathlib.Path | None) -> Attack:
    """One client sends `message` as fast as it can for `seconds` while reading whatever comes back; a
    connection the server closes is opened again at once (a handshake refused, tried again), as a
    determined attacker would. Then it waits until the address may connect again (the server throttles an
    address whose floods it closed), so the attacks after it start from a clean slate."""

    def run(url: str, headers: Headers) -> Outcome:
        counts = _Counts()
        connections, closed, turned_away = 0, 0, 0
        log_before = _size(log)
        began = time.perf_counter()
        while time.perf_counter() - began < seconds:
            try:
                websocket = connect(url, headers)
            except InvalidStatus:
                turned_away += 1
                continue
            connections += 1
            closed += _flood_one(websocket, message, began + seconds, counts)
        took = time.perf_counter() - began
        waited = _wait_until_admitted(url, headers)
        grown = _size(log) - log_before if log else None
        per_minute = "" if grown is None else f"; server log +{grown / 1e3:.1f} kB"
        per_minute += "" if grown is None else f" ({grown / took * 60 / MB:.3f} MB/min)"
        kind = "refused" if counts.other == 0 else "answered"
        return Outcome(
            kind,
            f"{counts.sent} sent in {took:.1f} s ({counts.sent / took:.0f}/s) over {connections} connections "
            f"({closed} closed by the server for flooding, {turned_away} handshakes refused; admitted again "
            f"{waited:.1f} s later), {counts.refused} refused, {counts.other} other replies{per_minute}",
        )

    return run


def _flood_one(websocket: Any, message: bytes, until: float, counts: "_Counts") -> bool:
    """Floods one connection until `until` or its close; whether the server closed it."""
    with websocket:
        websocket.recv(timeout=30)  # metadata
        done = threading.Event()

        def read() -> None:
            try:
                while not done.is_set() or counts.refused + counts.other < counts.sent:
                    reply = websocket.recv(timeout=5)
                    if isinstance(reply, str) and reply.startswith(("Bad request", "Too many")):
                        counts.refused += 1
                    else:
                        counts.other += 1
            except (TimeoutError, ConnectionClosed):
                pass

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        closed = False
        try:
            while time.perf_counter() < until:
                websocket.send(message)
                counts.sent += 1
        except ConnectionClosed:
            closed = True
        done.set()
        reader.join(timeout=15)
    return closed


def _wait_until_admitted(url: str, headers: Headers, timeout_s: float = 30.0) -> float:
    """Seconds until a robot connection from this address is admitted again (tried twice a second)."""
    began = time.perf_counter()
    while time.perf_counter() - began < timeout_s:
        try:
            connect(url, headers).close()
            break
        except InvalidStatus:
            time.sleep(0.5)
    return time.perf_counter() - began


def _size(path: pathlib.Path | None) -> int:
    return os.path.getsize(path) if path else 0


def _guess_keys(seconds: float) -> Attack:
    """One address tries wrong API keys as fast as it can: how many were checked (401) or throttled (429)."""

    def run(url: str, headers: Headers) -> Outcome:
        statuses: dict[int, int] = {}
        began, tries = time.perf_counter(), 0
        while time.perf_counter() - began < seconds:
            try:
                with connect(url, {"Authorization": f"Api-Key guess-{tries}"}, open_timeout=10):
                    return Outcome("answered", f"a wrong key was accepted after {tries} tries")
            except InvalidStatus as error:
                status = error.response.status_code
                statuses[status] = statuses.get(status, 0) + 1
            tries += 1
        took = time.perf_counter() - began
        time.sleep(THROTTLE_S)  # until this address (the healthy robots' too) may present a key again
        checked = statuses.get(401, 0)
        return Outcome(
            "refused",
            f"{tries} tries in {took:.1f} s: {checked} keys checked ({checked / took:.1f}/s), HTTP statuses "
            f"{dict(sorted(statuses.items()))}",
        )

    return run


def _handshakes(count: int) -> Attack:
    """`count` robots connect at once, each reads its metadata and leaves."""

    def one(url: str, headers: Headers) -> str:
        try:
            with connect(url, headers, open_timeout=60) as websocket:
                websocket.recv(timeout=60)
                return "served"
        except InvalidStatus as error:
            return f"HTTP {error.response.status_code}"
        except (OSError, TimeoutError, ConnectionClosed) as error:
            return type(error).__name__

    def run(url: str, headers: Headers) -> Outcome:
        began = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(count) as pool:
            results = list(pool.map(lambda _: one(url, headers), range(count)))
        tally = {result: results.count(result) for result in sorted(set(results))}
        refused = set(tally) <= {"served", "HTTP 503"}
        return Outcome(
            "answered" if refused else "mixed",
            f"{tally} in {time.perf_counter() - began:.1f} s",
        )

    return run


def warm_crowd(url: str, headers: Headers, message: bytes, robots: int = 6, rounds: int = 3) -> None:
    """`robots` robots send `message` at once, `rounds` times: the server's first batches of that size
    (programs, buffers) are made before any attack, so an attack's memory is its own."""

    def robot(_: int) -> None:
        with connect(url, headers) as websocket:
            websocket.recv(timeout=60)  # metadata
            for _ in range(rounds):
                websocket.send(message)
                websocket.recv(timeout=600)  # the first batch of a size may compile

    with concurrent.futures.ThreadPoolExecutor(robots) as pool:
        list(pool.map(robot, range(robots)))


def kept_sending_at_shutdown(
    url: str, headers: Headers, base: dict[str, Any], stop: Callable[[], None], robots: int = 4
) -> Outcome:
    """`robots` robots send requests back to back (two in flight each), and keep sending after `stop()`
    (SIGTERM) until the server closes them. Every request must be answered, refused in one line, or be on
    its way when the server's close arrives with its reason (1001 "server shutting down": the requests
    that crossed it); any other end loses them."""
    message = msgpack_numpy.packb(base)
    tallies = [_Counts() for _ in range(robots)]
    crossed, lost, closes = [0], [0], set()

    def robot(counts: _Counts) -> None:
        in_flight = 0
        try:
            with connect(url, headers) as websocket:
                websocket.recv(timeout=60)  # metadata
                for _ in range(2):
                    websocket.send(message)
                    counts.sent, in_flight = counts.sent + 1, in_flight + 1
                while True:
                    reply = websocket.recv(timeout=120)
                    in_flight -= 1
                    if isinstance(reply, bytes):
                        counts.other += 1
                    else:
                        counts.refused += 1
                    websocket.send(message)
                    counts.sent, in_flight = counts.sent + 1, in_flight + 1
        except ConnectionClosed as error:
            close = error.rcvd
            closes.add(f"{close.code} {close.reason}" if close else "no close frame")
            if close is not None and close.code == 1001 and close.reason:
                crossed[0] += in_flight
            else:
                lost[0] += in_flight
        except (InvalidStatus, TimeoutError) as error:
            closes.add(type(error).__name__)
            lost[0] += in_flight + 1

    threads = [threading.Thread(target=robot, args=(c,), daemon=True) for c in tallies]
    for thread in threads:
        thread.start()
    time.sleep(2.0)
    stop()
    for thread in threads:
        thread.join(timeout=180)
    sent = sum(c.sent for c in tallies)
    answered = sum(c.other for c in tallies)
    refused = sum(c.refused for c in tallies)
    return Outcome(
        "answered" if lost[0] == 0 and answered + refused + crossed[0] == sent else "lost",
        f"{sent} sent: {answered} answered, {refused} refused in one line, {crossed[0]} on their way when "
        f"the close came, {lost[0]} lost; closes: {sorted(closes)}",
    )
