"""How long a running `oxygen-serve` of a detour config takes to answer one detour observation back to
back, with one chunk per request and with `samples` (what the served closed loop's first request of an
episode asks for): the p50 and p90 of each, after two warm-up requests of each.

  oxygen-serve --config=pi05_detour_prefix --params_dtype=float32 --port=18766 --max_text_tokens=0 &
  python scripts/served_samples_latency.py --port=18766 --samples=8
"""

import time

import numpy as np
from absl import app, flags
from openpi_client import websocket_client_policy

from oxygen_jax.evaluation import closed_loop
from oxygen_jax.table_task import detour

_HOST = flags.DEFINE_string("host", "127.0.0.1", "The server's host.")
_PORT = flags.DEFINE_integer("port", 8000, "The server's port.")
_SAMPLES = flags.DEFINE_integer("samples", 8, "Chunks the second series of requests asks for.")
_REQUESTS = flags.DEFINE_integer("requests", 40, "Requests timed per series.")


def main(_) -> None:
    client = websocket_client_policy.WebsocketClientPolicy(host=_HOST.value, port=_PORT.value)
    obs = closed_loop.DetourWorld(next(detour.scenes(detour.HELD_OUT_SEED))).observe()
    series = {1: obs, _SAMPLES.value: {**obs, "samples": _SAMPLES.value}}
    for request in [*series.values(), *series.values()]:  # compiles what each series runs
        client.infer(request)
    for samples, request in series.items():
        seconds = []
        for _ in range(_REQUESTS.value):
            began = time.perf_counter()
            client.infer(request)
            seconds.append(time.perf_counter() - began)
        p50, p90 = (float(np.quantile(seconds, q)) * 1e3 for q in (0.5, 0.9))
        print(f"samples={samples}: p50 {p50:.1f} ms, p90 {p90:.1f} ms over {len(seconds)} requests")


if __name__ == "__main__":
    app.run(main)
