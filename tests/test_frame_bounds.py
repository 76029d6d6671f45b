"""`serving/frame_bounds.py`: it follows the frames websockets' own client writes, however the bytes
are split, and says how much of each payload is still to come."""

import numpy as np
import pytest
from websockets.frames import Frame, Opcode

from oxygen_jax.serving.frame_bounds import FrameBounds

REQUEST = b"GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n\r\n"
# Payload sizes across the 7-bit, 16-bit and 64-bit length forms, empty frames and a control frame.
FRAMES = [(Opcode.BINARY, 0), (Opcode.TEXT, 5), (Opcode.BINARY, 125), (Opcode.PING, 4), (Opcode.BINARY, 126)]
FRAMES += [(Opcode.CONT, 127), (Opcode.BINARY, 4000), (Opcode.BINARY, 65535), (Opcode.BINARY, 65536)]
FRAMES += [(Opcode.CLOSE, 0), (Opcode.BINARY, 1)]


def stream(mask: bool) -> tuple[bytes, list[int]]:
    """The request and frames as websockets writes them, and the payload still to come after each
    byte: none inside the request or a header, all of it after a header's last byte, then one fewer per
    byte."""
    data, left = bytearray(REQUEST), [0] * len(REQUEST)
    for opcode, size in FRAMES:
        wire = Frame(opcode, b"a" * size).serialize(mask=mask)
        data += wire
        left += [0] * (len(wire) - size - 1) + [size] + list(range(size - 1, -1, -1))
    return bytes(data), left


@pytest.mark.parametrize("mask", [True, False])
def test_it_says_the_payload_to_come_after_every_byte_whatever_the_split(mask):
    data, left = stream(mask)
    rng = np.random.default_rng(0)
    for chunk in (1, 2, 3, 7, 4096, len(data)):
        bounds, at = FrameBounds(), 0
        while at < len(data):
            step = min(len(data) - at, int(rng.integers(1, chunk + 1)))
            bounds.advance(data[at : at + step])
            at += step
            assert bounds.payload_left == left[at - 1], (chunk, at)


def test_nothing_before_the_requests_blank_line_counts_as_a_frame():
    bounds = FrameBounds()
    bounds.advance(b"GET / HTTP/1.1\r\nX: \x82\x7f\r")  # a frame-like header inside the request
    assert bounds.payload_left == 0
    bounds.advance(b"\n\r\n\x82\x7e\x01")
    assert bounds.payload_left == 0  # the 16-bit length is not whole yet
    bounds.advance(b"\x00")
    assert bounds.payload_left == 256
