"""Attacks that try to stall every robot or lock new ones out, for `probe_isolation.py`, and the table of
what each did to the healthy robot beside it.

The first row is a control: no attack, only time, to show how much the machine alone (other processes,
the runtime's own decode chunks) varies the healthy robot's latency. A row's worst of n replies grows
with n even with no attack, so each row also gives the control's typical worst of as many replies (the
median over every n consecutive replies of the control; `control_worst`). Each attack is sized by
`scale` (1: the recorded figures' sizes, e.g. a 15 MB message and a 30 s control; tests pass less):
- `15 MB list of ints x3`: three connections at once each send a request with an extra key holding a list
  of 15 M small ints (it used to be walked element by element on the event loop);
- `63 idle subscribers + 60 idle robots`: they stay open while a new robot connects and is answered;
- `1-byte fragments`: one request sent a byte per frame every 0.2 s (the server closes it at its receive
  deadline);
- `15 MB task instruction` and `four 1 MiB task names` (refused before anything is tokenized);
- `task options as strings and floats`: `max_text_tokens` "5" and 2.7, `temperature` "0.5" inside a task;
- `no API key`: a robot without the key, and the versions the `Server` header names.
"""

import concurrent.futures
import statistics
import threading
import time
import urllib.request
from typing import Any

from hostile_probe import (  # scripts/hostile_probe.py, beside this script
    Attack,
    Headers,
    Outcome,
    ProbeReport,
    connect,
    fault_attack,
    request_attack,
)
from websockets.exceptions import ConnectionClosed, InvalidStatus

from oxygen_jax.serving import msgpack_numpy

MB = 10**6
# The control's length at scale 1: about 950-1100 replies on a 2-core CPU, as many as the flood's row, the
# longest (a longer row's control's worst of as many is the control's worst).
CONTROL_S = 30.0
CONTROL_SUFFIX = "(control)"


def stall_attacks(base: dict[str, Any], *, scale: float = 1.0) -> dict[str, Attack]:
    """Name -> attack; `base` is a valid observation of the robot."""
    ints = int(15 * MB * scale)
    big_list = msgpack_numpy.packb(base | {"junk": [1] * ints})
    task_options = [
        {"t": {"instruction": "what next", "max_text_tokens": "5"}},
        {"t": {"instruction": "what next", "max_text_tokens": 2.7}},
        {"t": {"instruction": "what next", "temperature": "0.5"}},
    ]
    names = {"n" * int(2**20 * scale) + str(i): "what next" for i in range(4)}
    control_s = max(1.0, CONTROL_S * scale)
    return {
        f"no attack for {control_s:g} s {CONTROL_SUFFIX}": _nothing(control_s),
        f"{ints / MB:g} MB list of ints x3": _in_parallel(_raw(big_list), 3),
        "63 idle subscribers + 60 idle robots": _crowd(63, 60),
        "1-byte fragments": _trickle(msgpack_numpy.packb(base), interval_s=0.2),
        f"{ints / MB:g} MB task instruction": request_attack(base | {"text_tasks": {"t": "a" * ints}}),
        f"four {2**20 * scale / 2**20:g} MiB task names": request_attack(base | {"text_tasks": names}),
        "task options as strings and floats": _all_refused([base | {"text_tasks": t} for t in task_options]),
        "no API key": _without_key,
    }


def _nothing(seconds: float) -> Attack:
    """No attack for `seconds`: what the machine alone does to the healthy robot's latency."""

    def wait(url: str, headers: Headers) -> Outcome:
        time.sleep(seconds)
        return Outcome("answered", f"nothing sent for {seconds:g} s")

    return wait


def _raw(message: bytes) -> Attack:
    return fault_attack(lambda websocket: websocket.send(message))


def _in_parallel(attack: Attack, count: int) -> Attack:
    """`count` copies of `attack` at once; the outcome of the first, noting whether the others agree."""

    def run(url: str, headers: Headers) -> Outcome:
        with concurrent.futures.ThreadPoolExecutor(count) as pool:
            outcomes = list(pool.map(lambda _: attack(url, headers), range(count)))
        same = all(outcome.kind == outcomes[0].kind for outcome in outcomes)
        return Outcome(outcomes[0].kind if same else "mixed", outcomes[0].detail)

    return run


def _all_refused(requests: list[dict[str, Any]]) -> Attack:
    def run(url: str, headers: Headers) -> Outcome:
        outcomes = [request_attack(request)(url, headers) for request in requests]
        refused = [outcome for outcome in outcomes if outcome.kind == "refused"]
        kind = "refused" if len(refused) == len(outcomes) else "answered"
        return Outcome(kind, f"{len(refused)} of {len(outcomes)} refused: {outcomes[0].detail}")

    return run


def _crowd(subscribers: int, robots: int) -> Attack:
    """Opens idle `/text` subscribers and idle robots, then a new robot; its outcome is the new robot's."""

    def run(url: str, headers: Headers) -> Outcome:
        held = []
        try:
            for path, count in (("/text", subscribers), ("", robots)):
                for _ in range(count):
                    held.append(connect(url + path, headers))
            with connect(url, headers) as newcomer:
                newcomer.recv(timeout=30)  # metadata: it has a slot
                return Outcome("answered", f"a new robot connected beside {subscribers} + {robots} idle")
        except InvalidStatus as error:
            return Outcome("locked out", f"{len(held)} open, then HTTP {error.response.status_code}")
        finally:
            # At once: a subscriber's client stops reading after 16 unread events, so each close waits out
            # the client's 10 s close timeout (one at a time, the row lasted ~50 s of the client's waits).
            with concurrent.futures.ThreadPoolExecutor(max(1, len(held))) as closing:
                list(closing.map(lambda connection: connection.close(), held))

    return run


def _trickle(message: bytes, interval_s: float) -> Attack:
    """Sends `message` one byte per frame; the server should close it at its receive deadline."""

    def frames():
        for i in range(len(message)):
            yield message[i : i + 1]
            time.sleep(interval_s)

    def send(websocket: Any) -> Outcome:
        began = time.perf_counter()
        try:
            websocket.send(frames())
        except ConnectionClosed:
            seconds = time.perf_counter() - began
            return Outcome(
                "closed", f"code {websocket.close_code} after {seconds:.1f} s: {websocket.close_reason}"
            )
        return Outcome("answered", "the whole message was trickled in")

    return fault_attack(send)


def _without_key(url: str, headers: Headers) -> Outcome:
    """A robot without the API key; also what the `Server` header gives away."""
    http_url = "http" + url.removeprefix("ws") + "/healthz"
    with urllib.request.urlopen(http_url, timeout=10) as response:
        server = response.headers.get("Server")
    versions = f"Server header: {server!r}"
    try:
        with connect(url, None) as websocket:
            websocket.recv(timeout=30)
            return Outcome("answered", f"served without a key; {versions}")
    except InvalidStatus as error:
        return Outcome("refused", f"HTTP {error.response.status_code}; {versions}")


class RssSampler(threading.Thread):
    """Samples a process's resident memory every 50 ms until stopped."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self._pid = pid
        self.samples: list[tuple[float, int]] = []
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.wait(0.05):
            try:
                with open(f"/proc/{self._pid}/status") as status:
                    kb = next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))
            except (OSError, StopIteration):
                return
            self.samples.append((time.perf_counter(), kb * 1024))

    def stop(self) -> None:
        self._stop_event.set()
        self.join()

    def peak(self, start: float, end: float) -> int | None:
        inside = [rss for t, rss in self.samples if start <= t <= end]
        return max(inside) if inside else None


def stall_table(report: ProbeReport, names: list[str], rss: RssSampler | None) -> list[dict[str, Any]]:
    """Per attack (and for the rest one row per outcome: refused, answered, closed): the healthy robot's
    replies received in its window (from the attack's start until the robot settled after it: each reply
    belongs to one attack, the one under way or just over when it came), their worst latency against its
    median alone (before the first attack) and against its median just before the attack (its
    `ProbeReport.quiet` replies: the machine's drift set aside), errors, and the server's peak RSS during
    it over its RSS just before the first attack; beside the worst, the control's worst of as many replies
    (`control_worst`; None without a control)."""
    first = min(start for start, _ in report.windows.values())
    alone = [got - sent for sent, got, _ in report.healthy_times if got < first]
    median = statistics.median(alone)
    before = [memory for t, memory in rss.samples if t < first] if rss else []
    baseline = before[-1] if before else None  # just before the first attack, after the warm-up
    # name -> (attacks, what the attacker got); the earlier kinds by what they got: the target is refusals'
    groups = {name: ([name], report.outcomes[name].kind) for name in names if name in report.windows}
    earlier: dict[str, list[str]] = {}
    for name in report.windows:
        if name not in names:
            earlier.setdefault(report.outcomes[name].kind, []).append(name)
    for kind, attacks in sorted(earlier.items(), key=lambda item: -len(item[1])):
        groups[f"the {len(attacks)} earlier kinds {kind}"] = (attacks, kind)
    controls = [window for name, window in report.windows.items() if name.endswith(CONTROL_SUFFIX)]
    control = [latency for latency, _ in _received(report, controls)]
    rows = []
    for name, (attacks, got) in groups.items():
        windows = [report.windows[attack] for attack in attacks]
        during = _received(report, windows)
        quiet = _received(report, [report.quiet[attack] for attack in attacks if attack in report.quiet])
        local = statistics.median(latency for latency, _ in quiet) if quiet else None
        worst = max((latency for latency, _ in during), default=0.0)
        floor = control_worst(control, len(during))
        peaks = [rss.peak(start, end) for start, end in windows] if rss else []
        peak = max((p for p in peaks if p is not None), default=None)
        rows.append(
            {
                "attack": name,
                "attacker got": got,
                "healthy replies": len(during),
                "worst ms": round(worst * 1000, 1),
                "median alone ms": round(median * 1000, 1),
                "worst / median": round(worst / median, 2) if during else None,
                "median just before ms": None if local is None else round(local * 1000, 1),
                "worst / median just before": round(worst / local, 2) if during and local else None,
                "control's worst of as many / median": None if floor is None else round(floor / median, 2),
                "healthy errors or changes": sum(not ok for _, ok in during),
                "RSS +MB": None if peak is None or baseline is None else round((peak - baseline) / 2**20),
            }
        )
    return rows


def _received(report: ProbeReport, windows: list[tuple[float, float]]) -> list[tuple[float, bool]]:
    """(latency, unchanged) of each healthy reply received in one of `windows`, in the order sent."""
    return [
        (got - sent, ok)
        for sent, got, ok in report.healthy_times
        if any(start <= got < end for start, end in windows)
    ]


def control_worst(control: list[float], count: int) -> float | None:
    """The median, over every run of `count` consecutive latencies of the control, of the run's worst:
    what a row of `count` replies shows with no attack (the control's worst when it has fewer; None
    without a control or replies)."""
    if not control or count < 1:
        return None
    if count >= len(control):
        return max(control)
    return statistics.median(max(control[i : i + count]) for i in range(len(control) - count + 1))


def markdown(rows: list[dict[str, Any]]) -> str:
    header = list(rows[0])
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(row.get(key, "")) for key in header) + " |" for row in rows]
    return "\n".join(lines)
