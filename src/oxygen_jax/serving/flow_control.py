"""The server's bounds on what clients may make it hold or do per second: pending bytes, request and
handshake rates, and log lines (`websocket_server` applies them).

- `ReadBudget`: bytes of the requests a connection sent that the server has not answered yet (read or
  not), counted per connection and for the server. Past either bound the connection stops being read
  (TCP pushes back on the client) until its requests are answered; a connection with nothing pending is
  never paused, so a robot that waits for each reply is never slowed by others' backlog.
- `ReceiveTurn`: one connection at a time reads a large message at full speed.
- `TokenBucket`: `rate` events a second with bursts of `burst` (requests of one connection, handshakes).
- `AddressThrottle`: offences per client address (failed API keys at the server's handshakes and a fleet's
  ingress, connections closed for flooding), past a burst refused unchecked.
- `RefusalHold`: such a refusal is held until the address may try again, so a client that retries at once
  tries at the throttle's rate, not as fast as the server can refuse it.
- `LogThrottle`: the first line of a kind per key and interval, then one line that counts the rest, so a
  client repeating a fault cannot flood the log.
"""

import asyncio
import collections
import contextlib
import logging
import math
import time
from collections.abc import Hashable
from typing import Protocol


class Reader(Protocol):
    """A connection whose reading can be paused (its transport's)."""

    pending_bytes: int

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...


class ReadBudget:
    """Pending bytes per connection (`per_connection`) and in all (`total`); None: no bound."""

    def __init__(self, per_connection: int | None, total: int | None) -> None:
        self.per_connection = per_connection
        self.total = total
        self.pending = 0
        self._paused: set[Reader] = set()

    def received(self, reader: Reader, size: int) -> None:
        reader.pending_bytes += size
        self.pending += size
        if reader not in self._paused and self._over(reader):
            self._paused.add(reader)
            reader.pause_reading()

    def released(self, reader: Reader, size: int) -> None:
        reader.pending_bytes -= size
        self.pending -= size
        for paused in [paused for paused in self._paused if not self._over(paused)]:
            self._paused.discard(paused)
            paused.resume_reading()

    def forget(self, reader: Reader) -> None:
        """The connection is gone: what it left pending no longer counts."""
        self._paused.discard(reader)
        self.released(reader, reader.pending_bytes)

    def _over(self, reader: Reader) -> bool:
        if self.per_connection is not None and reader.pending_bytes > self.per_connection:
            return True
        return self.total is not None and self.pending > self.total and reader.pending_bytes > 0


class TurnTaker(Protocol):
    """A connection that waits for its turn with its reading paused."""

    def turn_granted(self) -> None: ...


class ReceiveTurn:
    """Which connection reads a large message now. Its parser's buffer grows by appending, which copies
    it whenever it outgrows its allocation; one buffer grows in place, but several growing at once
    interleave on the heap and are copied over and over: three 15 MB messages arriving together cost the
    server twice the CPU of the same three one after another (29.5 against 13.5 ms each on a 2-core CPU,
    `scripts/receive_cpu.py`; 19.2 ms in turn), all of it taken from the model's frames. So a connection
    in the middle of a large message reads while it holds the turn; the others wait in line, their bytes
    in the kernel's buffers (TCP pushes back). The holder passes the turn on when its message is whole or
    when it runs out of bytes at hand (a read shorter than a full one): a slow sender holds no one up,
    and no byte waits for another's network."""

    def __init__(self) -> None:
        self.holder: TurnTaker | None = None
        self._line: collections.deque[TurnTaker] = collections.deque()

    def take(self, taker: TurnTaker) -> bool:
        """Whether `taker` may read on: it holds the turn, or gets it if free; else it joins the line."""
        if self.holder is None:
            self.holder = taker
        if self.holder is taker:
            return True
        if taker not in self._line:
            self._line.append(taker)
        return False

    def pass_on(self, taker: TurnTaker, *, done: bool) -> bool:
        """The holder ran out of bytes at hand, or its message is `done`: the next in line gets the turn,
        and a holder not done joins the line. Whether `taker` may read on."""
        if self.holder is not taker:
            return True
        if not self._line:
            self.holder = None if done else taker
            return True
        self.holder = self._line.popleft()
        self.holder.turn_granted()
        if not done:
            self._line.append(taker)
        return done

    def forget(self, taker: TurnTaker) -> None:
        """The connection is gone (or no longer counted): out of the line, its turn to the next."""
        if taker in self._line:
            self._line.remove(taker)
        if self.holder is taker:
            self.pass_on(taker, done=True)


class TokenBucket:
    """`rate` tokens a second, at most `burst` saved up."""

    def __init__(self, rate: float, burst: float) -> None:
        self.rate = rate
        self.burst = burst
        self._tokens = burst
        self._stamp = time.monotonic()

    def take(self) -> bool:
        """Takes a token if one is there."""
        return self.reserve(0.0) is not None

    def spend(self, tokens: float) -> None:
        """Takes `tokens` whether or not they are there (the bucket may go negative: a debt to refill)."""
        self._tokens = self.tokens - tokens

    def wait_s(self) -> float:
        """How long until a token is there (none is taken)."""
        return max(0.0, (1.0 - self.tokens) / self.rate)

    def reserve(self, max_wait_s: float) -> float | None:
        """Takes the next token and returns how long to wait for it, or None (nothing taken) when that
        would be longer than `max_wait_s`."""
        wait = self.wait_s()
        if wait > max_wait_s:
            return None
        self._tokens -= 1.0
        return wait

    @property
    def tokens(self) -> float:
        """Tokens there now (negative: reserved ahead)."""
        now = time.monotonic()
        self._tokens = min(self.burst, self._tokens + (now - self._stamp) * self.rate)
        self._stamp = now
        return self._tokens


class AddressThrottle:
    """Offences per client address (a failed API key, a flood): `burst` at once, then `rate` a second; past
    that the address is throttled (its connections refused unchecked) until its bucket refills. Addresses
    whose offences lie far enough back are forgotten, so the table stays small."""

    def __init__(self, rate: float, burst: float) -> None:
        self.rate = rate
        self.burst = burst
        self._buckets: dict[str, TokenBucket] = {}

    def throttled(self, address: str) -> bool:
        bucket = self._buckets.get(address)
        return bucket is not None and bucket.tokens < 1

    def wait_s(self, address: str) -> float:
        """How long until the address may offend again (0 when it is not throttled)."""
        bucket = self._buckets.get(address)
        return 0.0 if bucket is None else bucket.wait_s()

    def retry_after(self, address: str) -> str:
        """A 429's ``Retry-After``: whole seconds until the address may offend again."""
        return str(math.ceil(self.wait_s(address)))

    def offended(self, address: str) -> None:
        bucket = self._buckets.get(address)
        if bucket is None:
            for known in [known for known, old in self._buckets.items() if old.tokens >= self.burst]:
                del self._buckets[known]
            bucket = self._buckets[address] = TokenBucket(self.rate, self.burst)
        bucket.take()


class RefusalHold:
    """Holds refusals of throttled addresses, each until its address may try again but at most
    `max_hold_s`, and at most `max_held` at once (past that a refusal goes out at once, so an attacker's
    parallel connections cannot hold the server's sockets). Refused at once, a wrong-key guesser or a
    flood that reconnects tries again as fast as the server refuses it (~400 handshakes a second on a
    2-core CPU, which served robots feel); held, it tries at the throttle's rate."""

    def __init__(self, max_held: int, max_hold_s: float) -> None:
        self.max_held = max_held
        self.max_hold_s = max_hold_s
        self.held = 0

    async def hold(self, wait_s: float, release: asyncio.Event | None = None) -> None:
        """Waits `wait_s` (at most `max_hold_s`) unless `max_held` are held already; `release` (a drain,
        say) ends the wait early."""
        if wait_s <= 0 or self.held >= self.max_held:
            return
        self.held += 1
        try:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(min(wait_s, self.max_hold_s)):
                    await (release or asyncio.Event()).wait()
        finally:
            self.held -= 1


class LogThrottle:
    """Logs the first message per key and interval; the others of that interval are counted and reported
    in one line when the next interval starts or the key is flushed. It remembers at most `MAX_KEYS`
    keys (then flushes the oldest), however many clients come and go."""

    MAX_KEYS = 4096

    def __init__(self, logger: logging.Logger, interval_s: float) -> None:
        self._logger = logger
        self.interval_s = interval_s
        self._since: dict[Hashable, tuple[float, int, str]] = {}  # key -> (interval start, held, what)

    def log(self, level: int, key: Hashable, what: str, message: str, *args: object) -> None:
        """`message % args` at `level`, unless `key` had a line this interval; `what` names the kind
        in the summary line (e.g. "bad requests from ('1.2.3.4', 5)")."""
        now = time.monotonic()
        start, held, _ = self._since.get(key, (0.0, 0, what))
        if now - start < self.interval_s:
            self._since[key] = (start, held + 1, what)
            return
        self.flush(key)
        if len(self._since) >= self.MAX_KEYS:
            self.flush(next(iter(self._since)))
        self._since[key] = (now, 0, what)
        self._logger.log(level, message, *args)

    def flush(self, key: Hashable) -> None:
        """Reports the messages `key` held back, and forgets it."""
        _, held, what = self._since.pop(key, (0.0, 0, ""))
        if held:
            self._logger.info("... and %d more %s within %g s", held, what, self.interval_s)
