"""Attack a running policy server as a hostile client would, while a healthy robot checks its own replies.

A healthy client sends the same observation with the same action noise over and over; every reply must
equal the first one it got (to float32 batch rounding) and its text must keep arriving. Meanwhile an
attacker sends one request of each hostile kind (`hostile_requests`: malformed observations and options
built from the robot's `RawSpec`) and a few transport faults (`FAULTS`: bytes that are not msgpack, a text
frame, a 200 MB message, a disconnect with a request in flight, a silent connection), then whatever
further attacks the caller adds (`scripts/stall_attacks.py`). The result (`ProbeReport`) says, per kind,
what the attacker got back and whether the healthy robot noticed, and holds each healthy request's send
and reply times and each attack's time window, so its latency during each attack can be told apart.

Only the attacker's own connection may suffer: a one-line `Bad request: ...` (or a normal reply, for
input the robot's transforms ignore), a closed connection for a message over the limit.
"""

import dataclasses
import itertools
import multiprocessing
import os
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import websockets.sync.client
from websockets.exceptions import ConnectionClosed

from oxygen_jax.policies.robot_io import RawSpec
from oxygen_jax.serving import msgpack_numpy

IMAGE_SHAPE = (224, 224, 3)
HEALTHY_ATOL = 1e-5  # a batch of two rounds differently from a batch of one (float32)
HEALTHY_ALONE = 30  # requests the healthy robot sends before any attack, for its median latency alone
# Before each attack, the healthy robot's replies alone that the attack is judged against: over a run the
# machine's own speed drifts by more than the attacks' effect (a 30 s control's median moved from 32 to
# 48 ms with no attack on a 2-core CPU), and that drift is not the attacker's.
QUIET_REPLIES = 20
# After an attack, the healthy robot's replies it must get to requests sent after the attack ended (then
# to one sent after that reply) before the next attack begins: an attack's aftermath is its own.
SETTLE_TIMEOUT_S = 30.0
Headers = dict[str, str] | None
Attack = Callable[[str, Headers], "Outcome"]


def auth_headers(api_key: str | None) -> Headers:
    """The header openpi-client sends for its `api_key`."""
    return {"Authorization": f"Api-Key {api_key}"} if api_key else None


def connect(url: str, headers: Headers, **options: Any) -> Any:
    """A websocket client connection as the probe's clients open them."""
    return websockets.sync.client.connect(url, max_size=None, additional_headers=headers, **options)


def valid_observation(spec: RawSpec, prompt: str = "pick up the bowl", seed: int = 0) -> dict[str, Any]:
    """An observation the robot's transforms take: every camera and vector of `spec`, and a prompt."""
    rng = np.random.default_rng(seed)
    obs: dict[str, Any] = {"prompt": prompt}
    for path in spec.cameras:
        image = rng.integers(0, 256, IMAGE_SHAPE, dtype=np.uint8)
        _put(obs, path, image.transpose(2, 0, 1) if spec.channels_first_only else image)
    for path, size in spec.vectors.items():
        _put(obs, path, rng.uniform(-1, 1, size).astype(np.float32))
    return obs


def hostile_requests(spec: RawSpec, base: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Name -> a whole request that is wrong in one way (or carries junk the server must ignore)."""
    camera, vector = next(iter(spec.cameras)), next(iter(spec.vectors))
    size = spec.vectors[vector]
    image = np.asarray(_get(base, camera))
    cases: dict[str, dict[str, Any]] = {}

    def replaced(path: tuple[str, ...], value: Any) -> dict[str, Any]:
        request = _copy(base)
        _put(request, path, value)
        return request

    for name, value in {
        "string": "abc",
        "None": None,
        "list of ints": [1, 2, 3],
        "uint16": image.astype(np.uint16) * 200,
        "int64": image.astype(np.int64),
        "bool": image > 127,
        "complex dtype on the wire": _wire_array(b"", "<c8", image.shape),
        "object dtype on the wire": _wire_array(b"", "|O", image.shape),
        "shape larger than its bytes": _wire_array(b"\0" * 10, "|u1", image.shape),
        "float out of [0, 1]": image.astype(np.float32),
        "float NaN": np.full(image.shape, np.nan, np.float32),
        "2-D": image[..., 0],
        "4-D": image[None],
        "1 channel": image[..., :1] if not spec.channels_first_only else image[:1],
        "empty": np.zeros((0, 0, 3), np.uint8),
        "nested map": {"x": image},
    }.items():
        cases[f"image {name}"] = replaced(camera, value)
    for name, value in {
        "string": "abc",
        "None": None,
        "too short": np.zeros(max(size - 5, 1), np.float32),
        "too long": np.zeros(size + 5, np.float32),
        "NaN": np.full(size, np.nan, np.float32),
        "inf": np.full(size, np.inf, np.float32),
        "2-D": np.zeros((size, 2), np.float32),
        "complex dtype on the wire": _wire_array(np.zeros(size, np.complex64).tobytes(), "<c8", (size,)),
        "list of strings": ["a"] * size,
        "1000-level nesting": _nested(1000),
    }.items():
        cases[f"state {name}"] = replaced(vector, value)
    for name, value in {
        "int": 7,
        "bytes": b"pick up the bowl",
        "list": ["pick", "up"],
        "100k characters": "a" * 100_000,
        "too many tokens": "bowl " * 399,
    }.items():
        cases[f"prompt {name}"] = replaced(("prompt",), value)
    for name, extra in {
        "temperature inf": {"temperature": float("inf")},
        "temperature NaN": {"temperature": float("nan")},
        "temperature negative": {"temperature": -1.0},
        "temperature string": {"temperature": "hot"},
        "top_p 0": {"top_p": 0.0},
        "top_p 2": {"top_p": 2.0},
        "max_text_tokens negative": {"max_text_tokens": -1},
        "max_text_tokens huge": {"max_text_tokens": 10**9},
        "noise wrong shape": {"noise": np.zeros((3, 3), np.float32)},
        "noise NaN": {"noise": np.full((10, 32), np.nan, np.float32)},
        "noise string": {"noise": "random"},
    }.items():
        cases[f"option {name}"] = _copy(base) | extra
    cases["extra actions key"] = _copy(base) | {"actions": np.zeros((10, 7), np.float32)}
    cases["extra unknown keys"] = _copy(base) | {"meta": {"a": [1, 2, {"b": "c"}]}, "x": np.zeros(3)}
    if spec.cameras[camera]:
        cases["missing camera"] = _drop(base, camera)
    cases["missing state"] = _drop(base, vector)
    return cases


@dataclasses.dataclass
class Outcome:
    """What the attacker got for one kind: `refused` (one-line `Bad request`), `answered`, `closed`,
    `internal` (`Internal server error`), or `multi-line` (a reply leaking more than one line)."""

    kind: str
    detail: str


@dataclasses.dataclass
class ProbeReport:
    outcomes: dict[str, Outcome]
    healthy_replies: int = 0
    healthy_affected: int = 0
    healthy_texts_done: int = 0
    healthy_errors: list[str] = dataclasses.field(default_factory=list)
    healthy_times: list[tuple[float, float, bool]] = dataclasses.field(default_factory=list)  # sent, got, ok
    windows: dict[str, tuple[float, float]] = dataclasses.field(default_factory=dict)  # attack -> start, end
    quiet: dict[str, tuple[float, float]] = dataclasses.field(default_factory=dict)  # attack -> alone before
    seconds: float = 0.0

    def summary(self) -> dict[str, Any]:
        kinds = [outcome.kind for outcome in self.outcomes.values()]
        return {
            "hostile_kinds": len(kinds),
            **{f"attacker_{kind}": kinds.count(kind) for kind in sorted(set(kinds))},
            "healthy_replies": self.healthy_replies,
            "healthy_affected": self.healthy_affected,
            "healthy_texts_done": self.healthy_texts_done,
            "seconds": round(self.seconds, 1),
        }


_FORK = multiprocessing.get_context("fork")
_HEALTHY_FIELDS = (
    "healthy_replies",
    "healthy_affected",
    "healthy_texts_done",
    "healthy_errors",
    "healthy_times",
)


class _HealthyRobot(_FORK.Process):
    """Sends one observation with fixed noise until stopped; counts replies that differ from its first
    and the language requests it saw finish. It runs in a process of its own, so that the attacker's work
    in this one (packing a 15 MB message, say) cannot delay it: its latency is the server's."""

    def __init__(self, url: str, headers: Headers, obs: dict[str, Any], report: ProbeReport) -> None:
        super().__init__(daemon=True)
        self._url, self._headers, self._report = url, headers, report
        self._request = obs | {"noise": np.random.default_rng(7).standard_normal((10, 32)).astype(np.float32)}
        self._stop_event = _FORK.Event()
        self.warm = _FORK.Event()  # set after its `HEALTHY_ALONE` requests alone
        self._last_sent = _FORK.Value("d", 0.0, lock=False)  # when the request last answered was sent
        self._answered = _FORK.Value("l", 0, lock=False)  # replies so far
        self._results, self._send_results = _FORK.Pipe(duplex=False)
        self._reference: np.ndarray | None = None

    def start(self) -> None:
        super().start()
        self._send_results.close()  # the child's copy remains: a child that dies ends `stop`'s wait

    def settle(self, after: float) -> float:
        """Waits until a request sent after `after` (a perf_counter time) was answered, then one sent
        after that reply, so the server has worked through what came before (at most
        `SETTLE_TIMEOUT_S`, or until the robot stops); returns when."""
        deadline = time.perf_counter() + SETTLE_TIMEOUT_S
        for _ in range(2):
            while self._last_sent.value <= after and self.is_alive() and time.perf_counter() < deadline:
                time.sleep(0.002)
            after = time.perf_counter()
        return after

    def alone(self, replies: int) -> tuple[float, float]:
        """Waits until it got `replies` more replies (at most `SETTLE_TIMEOUT_S`, or until the robot
        stops); the window they arrived in."""
        start = time.perf_counter()
        deadline, target = start + SETTLE_TIMEOUT_S, self._answered.value + replies
        while self._answered.value < target and self.is_alive() and time.perf_counter() < deadline:
            time.sleep(0.002)
        return start, time.perf_counter()

    def stop(self) -> None:
        """Stops it and copies what it saw into the report."""
        self._stop_event.set()
        fields = self._results.recv()
        self.join()
        for name, value in fields.items():
            setattr(self._report, name, value)

    def run(self) -> None:
        try:
            with connect(self._url, self._headers) as websocket:
                websocket.recv()  # metadata
                websocket.send(msgpack_numpy.packb(self._request))
                self._check(websocket.recv())  # the first request compiles: no latency to count
                for sent in itertools.count():
                    if self._stop_event.is_set():
                        break
                    start = time.perf_counter()
                    websocket.send(msgpack_numpy.packb(self._request))
                    ok = self._check(websocket.recv())
                    self._report.healthy_times.append((start, time.perf_counter(), ok))
                    self._last_sent.value = start
                    self._answered.value += 1
                    if sent + 1 == HEALTHY_ALONE:
                        self.warm.set()
        except (ConnectionClosed, OSError) as error:
            self._report.healthy_affected += 1
            self._report.healthy_errors.append(f"connection lost: {error}")
        finally:
            self.warm.set()
            self._send_results.send({name: getattr(self._report, name) for name in _HEALTHY_FIELDS})

    def _check(self, reply: str | bytes) -> bool:
        """Counts the reply; whether it is the robot's usual actions."""
        report = self._report
        report.healthy_replies += 1
        if isinstance(reply, str):
            report.healthy_affected += 1
            report.healthy_errors.append(reply.splitlines()[0])
            return False
        reply = msgpack_numpy.unpackb(reply)
        actions = np.asarray(reply["actions"])
        if self._reference is None:
            self._reference = actions
        same = actions.shape == self._reference.shape and np.allclose(
            actions, self._reference, atol=HEALTHY_ATOL
        )
        report.healthy_affected += int(not same)
        report.healthy_texts_done += int(bool(reply.get("text_done")))
        return same


def reply_outcome(reply: str | bytes) -> Outcome:
    """What the attacker got from one reply: actions, a one-line refusal, or worse."""
    if isinstance(reply, bytes):
        return Outcome("answered", ", ".join(sorted(msgpack_numpy.unpackb(reply))))
    if "\n" in reply:
        return Outcome("multi-line", reply.splitlines()[0])
    return Outcome("refused" if reply.startswith("Bad request") else "internal", reply)


def fault_attack(send: Callable[[Any], Any]) -> Attack:
    """An attack on a fresh connection: `send` acts on it, then the server's answer (if any) is read."""

    def attack(url: str, headers: Headers) -> Outcome:
        try:
            with connect(url, headers) as websocket:
                websocket.recv()
                result = send(websocket)
                return result if isinstance(result, Outcome) else reply_outcome(websocket.recv(timeout=120))
        except ConnectionClosed as error:
            return closed_outcome(error)

    return attack


def closed_outcome(error: ConnectionClosed) -> Outcome:
    """What the attacker got when the server closed its connection: the close code and reason."""
    close = error.rcvd
    return Outcome("closed", f"code {close.code} {close.reason}" if close else "no close frame")


def _leave_with_request_in_flight(base: dict[str, Any]) -> Callable[[Any], Outcome]:
    def send(websocket: Any) -> Outcome:
        websocket.send(msgpack_numpy.packb(base))
        websocket.close()
        return Outcome("answered", "disconnected before the reply")

    return send


def _silent(websocket: Any) -> Outcome:
    time.sleep(0.5)
    return Outcome("answered", "held a connection open without sending")


def faults(base: dict[str, Any]) -> dict[str, Attack]:
    """Transport-level faults, each on its own connection."""
    oversize = np.zeros(200 * 2**20, np.uint8)
    return {
        "fault not msgpack": fault_attack(lambda ws: ws.send(b"\xc1\xff not msgpack")),
        "fault text frame": fault_attack(lambda ws: ws.send("hello")),
        "fault msgpack list": fault_attack(lambda ws: ws.send(msgpack_numpy.packb([1, 2, 3]))),
        "fault 200 MB message": fault_attack(lambda ws: ws.send(msgpack_numpy.packb(base | {"x": oversize}))),
        "fault disconnect in flight": fault_attack(_leave_with_request_in_flight(base)),
        "fault silent connection": fault_attack(_silent),
    }


def request_attack(request: dict[str, Any]) -> Attack:
    """An attack that sends `request` on a fresh connection and reads the answer."""
    return fault_attack(lambda websocket: websocket.send(msgpack_numpy.packb(request)))


def probe(
    url: str,
    spec: RawSpec,
    *,
    api_key: str | None = None,
    more: Callable[[dict[str, Any]], dict[str, Attack]] | None = None,
    progress: Callable | None = None,
    attacker_nice: int = 0,
    only: str | None = None,
) -> ProbeReport:
    """Run every hostile kind and fault, then `more(base observation)`'s attacks, against the server at
    `url` (with `api_key`, if it needs one) beside a healthy robot, one after the other (with `only`, just
    those whose name contains it). Each attack follows `QUIET_REPLIES` of the healthy robot's replies with
    no attack (`ProbeReport.quiet`: its median just before). Each attack's window runs from its start
    until the healthy robot has settled after it (`_HealthyRobot.settle`), so the next starts on a server
    done with it. The attacks run at `attacker_nice` (this thread and those it starts, after the healthy
    robot's process has started), so on a machine the three share, the attacker's own work can stand
    aside as if it ran elsewhere."""
    base = valid_observation(spec)
    attacks: dict[str, Attack] = {
        name: request_attack(request) for name, request in hostile_requests(spec, base).items()
    }
    attacks |= faults(base)
    attacks |= more(base) if more else {}
    if only is not None:
        attacks = {name: attack for name, attack in attacks.items() if only in name}
    report = ProbeReport(outcomes={})
    headers = auth_headers(api_key)
    healthy = _HealthyRobot(url, headers, valid_observation(spec, seed=1), report)
    start = time.perf_counter()
    healthy.start()
    healthy.warm.wait(timeout=600)
    os.nice(attacker_nice)  # Linux: this thread only, and the threads it starts from now on
    names = progress(list(attacks)) if progress else list(attacks)
    for name in names:
        report.quiet[name] = healthy.alone(QUIET_REPLIES)
        began = time.perf_counter()
        report.outcomes[name] = attacks[name](url, headers)
        report.windows[name] = (began, healthy.settle(after=time.perf_counter()))
    healthy.stop()
    report.seconds = time.perf_counter() - start
    return report


def _wire_array(data: bytes, dtype: str, shape: tuple[int, ...]) -> dict[bytes, Any]:
    """An array as openpi's wire format spells it, with whatever dtype and shape a liar claims."""
    return {b"__ndarray__": True, b"data": data, b"dtype": dtype, b"shape": list(shape)}


def _nested(depth: int) -> dict:
    value: dict = {}
    for _ in range(depth):
        value = {"x": value}
    return value


def _get(obs: Mapping[str, Any], path: tuple[str, ...]) -> Any:
    for key in path:
        obs = obs[key]
    return obs


def _put(obs: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    for key in path[:-1]:
        obs = obs.setdefault(key, {})
    obs[path[-1]] = value


def _copy(obs: Mapping[str, Any]) -> dict[str, Any]:
    return {key: _copy(value) if isinstance(value, Mapping) else value for key, value in obs.items()}


def _drop(obs: Mapping[str, Any], path: tuple[str, ...]) -> dict[str, Any]:
    request = _copy(obs)
    parent = _get(request, path[:-1]) if len(path) > 1 else request
    del parent[path[-1]]
    return request
