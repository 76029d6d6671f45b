"""The memory of one large message reused by the next, instead of mapped fresh for every copy.

Receiving a message copies it a few times (the socket's reads into websockets' buffer, the frame's
payload out of it, unmasked), each copy into a new block of its size. glibc's malloc serves a block past
its mmap threshold (128 KiB until it adapts) with pages mapped for it and unmaps them when it is freed,
and hands freed memory at the heap's top back to the kernel past its trim threshold; its own adaptation
follows the largest block freed so far, and three connections' 15 MB messages outran it. So each copy
faulted in about 3,700 new pages, which cost the server as much CPU as the copies themselves:
`scripts/receive_cpu.py` measured 23.5 ms of server CPU per 15 MB message on three connections at once
and 15.5 ms on one with glibc's defaults, 12.5 and 11.5 ms with the thresholds set here (2-core CPU, the
two alternated). A trim threshold of only twice the message size kept too little (19 ms on three). Both
stay within the range glibc's adaptation may reach by itself (an mmap threshold of at most 32 MiB, a trim
threshold of twice that).
"""

import ctypes
import logging
import sys

logger = logging.getLogger(__name__)

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # mallopt's parameters (glibc's malloc.h)
MAX_MMAP_THRESHOLD = 32 * 2**20  # glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit
MAX_TRIM_THRESHOLD = 2 * MAX_MMAP_THRESHOLD  # where glibc's own adaptation stops
MESSAGE_COPIES = 4  # blocks of a message's size freed and taken again while it is received and decoded
GROWTH_SLACK = 1.25  # websockets' read buffer grows past the message by an eighth


def reuse_message_memory(max_message_bytes: int | None) -> bool:
    """Sets glibc's malloc so that blocks up to a message's size and slack (capped at `MAX_MMAP_THRESHOLD`)
    come from the heap, and keeps `MESSAGE_COPIES` of them there when freed (at most `MAX_TRIM_THRESHOLD`).
    Whether it could: another C library (macOS, musl) keeps its own policy. Process-wide, so every server
    in the process shares it."""
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None) if sys.platform == "linux" else None
    if mallopt is None:
        return False
    wanted = int(max_message_bytes * GROWTH_SLACK) if max_message_bytes else MAX_MMAP_THRESHOLD
    mmap_threshold = min(wanted, MAX_MMAP_THRESHOLD)
    trim_threshold = min(MESSAGE_COPIES * mmap_threshold, MAX_TRIM_THRESHOLD)
    done = bool(mallopt(M_MMAP_THRESHOLD, mmap_threshold)) and bool(mallopt(M_TRIM_THRESHOLD, trim_threshold))
    logger.debug("malloc: mmap threshold %d, trim threshold %d (%s)", mmap_threshold, trim_threshold, done)
    return done
