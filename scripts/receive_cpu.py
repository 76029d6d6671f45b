"""The server's CPU time to receive one large message, which every robot beside it shares.

  python scripts/receive_cpu.py                  # 15 MB messages, one connection, 8 servers in turn
  python scripts/receive_cpu.py --connections=3  # three connections sending at the same moment
  PYTHONPATH=/tmp/old/src python scripts/receive_cpu.py   # another commit's server (a git worktree)

Starts `websocket_server.open_server` with a backend that does nothing in a process of its own, then
`--rounds` times sends it one request of `--mb` MB on each of `--connections` connections at once (an
observation with a list of small ints beside it, which the decoder refuses at the list's header, as
`probe_isolation.py`'s 15 MB attack does) and waits for the answers, and reads the server process's user
and system CPU time from `/proc` (Linux): the socket reads, websockets' parsing and unmasking, and the
refusals. Prints the CPU per message of each server and their median.
"""

import os
import pathlib
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import websockets.sync.client
from absl import app, flags

from oxygen_jax.serving import msgpack_numpy

_MB = flags.DEFINE_float("mb", 15.0, "Size of each message, in MB (10^6 bytes) of ints.")
_ROUNDS = flags.DEFINE_integer("rounds", 10, "Rounds per server, each a message on every connection.")
_CONNECTIONS = flags.DEFINE_integer("connections", 1, "Connections that send at the same moment.")
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
    per_message, replies = [], set()

    def ask(websocket: websockets.sync.client.ClientConnection) -> None:
        websocket.send(message)
        replies.add(websocket.recv(timeout=60)[:60])

    for _ in range(_SERVERS.value):
        server = subprocess.Popen([sys.executable, "-c", SERVER], stdout=subprocess.PIPE)
        url = f"ws://127.0.0.1:{int(server.stdout.readline())}"
        connections = [websockets.sync.client.connect(url, max_size=None) for _ in range(_CONNECTIONS.value)]
        try:
            with ThreadPoolExecutor(len(connections)) as pool:
                for websocket in connections:
                    websocket.recv()  # metadata
                    ask(websocket)  # the first one warms the path up
                before = cpu_s(server.pid)
                for _ in range(_ROUNDS.value):
                    list(pool.map(ask, connections))
                spent = cpu_s(server.pid) - before
            per_message.append(spent / (_ROUNDS.value * len(connections)) * 1000)
        finally:
            for websocket in connections:
                websocket.close()
            server.kill()
            server.wait()
    print(f"{len(message) / 1e6:.1f} MB messages, {_CONNECTIONS.value} at once, answered {sorted(replies)}")
    print("server CPU ms per message:", [round(ms, 1) for ms in per_message])
    print(f"median {statistics.median(per_message):.1f} ms")


if __name__ == "__main__":
    app.run(main)
