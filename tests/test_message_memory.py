"""`message_memory`: a large message's blocks, freed, are taken again by the next one without new pages."""

import ctypes
import subprocess
import sys

import pytest

from oxygen_jax.serving import message_memory

# Rounds of four 15 MB blocks at once (as three connections' messages and their copies), each written,
# then freed; prints the page faults of each round. Run in a process of its own: malloc's state is
# process-wide and adapts to what was freed before.
ROUNDS = """
import resource, sys
from oxygen_jax.serving import message_memory
if sys.argv[1] == "reuse":
    assert message_memory.reuse_message_memory(16 * 2**20)
for _ in range(3):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    blocks = [bytearray(15_000_000) for _ in range(4)]
    del blocks
    print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""
PAGES_PER_ROUND = 4 * 15_000_000 // 4096  # 14,648 pages of 4 KiB


def _page_faults(mode: str) -> list[int]:
    result = subprocess.run([sys.executable, "-c", ROUNDS, mode], capture_output=True, text=True, check=True)
    return [int(line) for line in result.stdout.split()]


@pytest.mark.skipif(
    sys.platform != "linux" or not hasattr(ctypes.CDLL(None), "gnu_get_libc_version"), reason="glibc's malloc"
)
def test_freed_blocks_are_reused_instead_of_faulted_in_again():
    default, reused = _page_faults("default"), _page_faults("reuse")
    # With glibc's defaults every round maps its blocks afresh (the freed ones went back to the kernel).
    assert min(default) > PAGES_PER_ROUND // 2, default
    # Set for 16 MiB messages, the first round faults its pages in and later rounds reuse them.
    assert reused[0] > PAGES_PER_ROUND // 2, reused
    assert max(reused[1:]) < PAGES_PER_ROUND // 20, reused


def test_other_platforms_keep_their_malloc(monkeypatch):
    monkeypatch.setattr(sys, "platform", "darwin")
    assert not message_memory.reuse_message_memory(16 * 2**20)
