"""The API key check, and short-lived tickets that stand in for the key on a redirect.

A fleet's ingress redirects a robot's handshake to its replica's own server (`serving/ray_app.py`), and a
websocket client drops the `Authorization` header on a redirect to another origin. So the ingress checks
the key itself and puts a ticket in the redirect's query (`?ticket=<expiry>.<hmac-sha256(key, expiry)>`),
which the replica's server accepts in place of the header until it expires."""

import hashlib
import hmac
import time

# What openpi-client's `WebsocketClientPolicy(api_key=...)` sends.
AUTH_HEADER = "Authorization: Api-Key <key>"
# The query parameter that carries a ticket, and how long a ticket is good for.
TICKET_PARAM = "ticket"
TICKET_TTL_S = 30


def header_carries_key(sent: list[str], api_key: str) -> bool:
    """Whether the `Authorization` values `sent` are exactly one, the key as openpi-client sends it;
    compared in constant time."""
    return len(sent) == 1 and hmac.compare_digest(sent[0].encode(), f"Api-Key {api_key}".encode())


def mint(api_key: str, now: float | None = None) -> str:
    """A ticket good for `TICKET_TTL_S` seconds from `now` (default: the wall clock, which replicas on
    other nodes share)."""
    expiry = str(int((time.time() if now is None else now) + TICKET_TTL_S))
    return f"{expiry}.{_signature(api_key, expiry)}"


def valid(ticket: str, api_key: str, now: float | None = None) -> bool:
    """Whether `ticket` was minted with `api_key` and has not expired; the signature compared in constant
    time."""
    expiry, _, signature = ticket.partition(".")
    if not expiry.isdigit() or not hmac.compare_digest(
        signature.encode(), _signature(api_key, expiry).encode()
    ):
        return False
    return (time.time() if now is None else now) <= int(expiry)


def _signature(api_key: str, expiry: str) -> str:
    return hmac.new(api_key.encode(), expiry.encode(), hashlib.sha256).hexdigest()
