"""Where the frames a websocket client sends end, read from their headers as the bytes go by.

websockets' parser costs the event loop per frame, not per byte of payload, so the server hands it tiny
frames a slice at a time (a read full of them would hold the loop) but a frame's payload whole: 15 MB
handed over in 16 KiB slices, with reading paused and resumed around every read, took the server 28.5
ms of CPU, a read at a time 13.5 ms (`scripts/receive_cpu.py`). `FrameBounds` follows the opening
handshake's request to its blank line, then each frame's header (RFC 6455, section 5.2: two bytes, a
16- or 64-bit length when the 7-bit one says 126 or 127, a 4-byte mask when the mask bit is set), and says
how much of the payload under way is still to come. It only sizes what is handed over: websockets still
parses and checks every byte (a bad header closes the connection there).
"""

END_OF_REQUEST = b"\r\n\r\n"
EXTENDED_LENGTH = {126: 2, 127: 8}  # the 7-bit length that announces a longer one, and its bytes
MASK_BIT, LENGTH_BITS = 0x80, 0x7F
MASK_BYTES = 4


class FrameBounds:
    """Follows one client's byte stream; `payload_left`: bytes of the current frame's payload to come."""

    def __init__(self) -> None:
        self.payload_left = 0
        self._opening = True  # before the handshake request's blank line
        self._pending = bytearray()  # the request's last bytes, or a frame header's first ones

    def advance(self, data: bytes | bytearray | memoryview) -> None:
        """Takes the next bytes of the stream."""
        view, at = memoryview(data), 0
        while at < len(view):
            if self.payload_left:
                step = min(self.payload_left, len(view) - at)
                self.payload_left -= step
                at += step
            elif self._opening:
                at = self._end_of_request(view, at)
            else:
                at = self._header(view, at)

    def _end_of_request(self, view: memoryview, at: int) -> int:
        """Past the request's blank line, or to the end of `view` while it has not come."""
        seen = self._pending + view[at:]
        end = seen.find(END_OF_REQUEST)
        if end < 0:
            self._pending = seen[-(len(END_OF_REQUEST) - 1) :]
            return len(view)
        self._opening = False
        self._pending = bytearray()
        return len(view) - (len(seen) - end - len(END_OF_REQUEST))

    def _header(self, view: memoryview, at: int) -> int:
        """Past the next frame header once it is whole (its payload then to come), or to the end of
        `view` while it is not."""
        header = self._pending
        if not header and len(view) - at >= 2 and len(view) - at >= _header_size(view[at + 1]):
            header, at = view[at : at + _header_size(view[at + 1])], at + _header_size(view[at + 1])
        else:
            while len(header) < (2 if len(header) < 2 else _header_size(header[1])):
                if at == len(view):
                    return at
                header.append(view[at])
                at += 1
            self._pending = bytearray()
        extended = EXTENDED_LENGTH.get(header[1] & LENGTH_BITS, 0)
        length = int.from_bytes(header[2 : 2 + extended], "big") if extended else header[1] & LENGTH_BITS
        self.payload_left = length
        return at


def _header_size(second_byte: int) -> int:
    """A frame header's length in bytes, from its second byte."""
    extended = EXTENDED_LENGTH.get(second_byte & LENGTH_BITS, 0)
    return 2 + extended + (MASK_BYTES if second_byte & MASK_BIT else 0)
