"""The server's CPU time to receive one large message, which every robot beside it shares.

  python scripts/receive_cpu.py                  # 30 messages of 15 MB, 8 servers one after another
  PYTHONPATH=/tmp/old/src python scripts/receive_cpu.py   # another commit's server (a git worktree)

Starts `websocket_server.open_server` with a backend that does nothing in a process of its own, sends it
`--messages` requests of `--mb` MB one after another on one connection (an observation with a list of
small ints beside it, which the decoder refuses at the list's header, as `probe_isolation.py`'s 15 MB
attack does), and reads the server process's user and system CPU time from `/proc` (Linux): the socket
reads, websockets' parsing and unmasking, and the refusal. Prints the CPU per message of each server and
their median.
"""

import os
import pathlib
import statistics
import subprocess
import sys

import numpy as np
import websockets.sync.client
from absl import app, flags

from oxygen_jax.serving import msgpack_numpy

_MB = flags.DEFINE_float("mb", 15.0, "Size of each message, in MB (10^6 bytes) of ints.")
_MESSAGES = flags.DEFINE_integer("messages", 30, "Messages per server.")
_SERVERS = flags.DEFINE_integer("servers", 8, "Servers started one after another (the machine's noise).")

SERVER = """
import asyncio
from oxygen_jax.serving import websocket_server
class Idle:
    metadata = {}
    def infer(self, obs):
        return {}
async def main():
    async with websocket_server.open_server(Idle(), "127.0.0.1", 0) as port:
        print(port, flush=True)
        await asyncio.Event().wait()
asyncio.run(main())
"""


def cpu_s(pid: int) -> float:
    """User and system CPU seconds of process `pid` so far."""
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main(_):
    image = np.zeros((224, 224, 3), np.uint8)
    message = msgpack_numpy.packb({"image": image, "junk": [1] * int(_MB.value * 1e6)})
    per_message = []
    for _ in range(_SERVERS.value):
        server = subprocess.Popen([sys.executable, "-c", SERVER], stdout=subprocess.PIPE)
        try:
            port = int(server.stdout.readline())
            with websockets.sync.client.connect(f"ws://127.0.0.1:{port}", max_size=None) as websocket:
                websocket.recv()  # metadata
                websocket.send(message)
                reply = websocket.recv(timeout=60)  # the first one warms the path up
                before = cpu_s(server.pid)
                for _ in range(_MESSAGES.value):
                    websocket.send(message)
                    websocket.recv(timeout=60)
                per_message.append((cpu_s(server.pid) - before) / _MESSAGES.value * 1000)
        finally:
            server.kill()
            server.wait()
    print(f"{len(message) / 1e6:.1f} MB messages, answered {reply[:60]!r}")
    print("server CPU ms per message:", [round(ms, 1) for ms in per_message])
    print(f"median {statistics.median(per_message):.1f} ms")


if __name__ == "__main__":
    app.run(main)
