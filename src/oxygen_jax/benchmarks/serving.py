"""Closed-loop robots against the device loop: action reply latency, text latency and finished tokens/s.

R robot threads each send an observation, wait for its actions, "execute" them for T ms (sleep), and
repeat, as openpi's LIBERO client does between replans. A robot's language request of N tokens starts
with its observation whenever its previous one is done. Modes: `action_only` (no language), `frame`
(the frame loop: decode(k) inside each frame, before its replies) and `async` (replies first, decode
chunks in idle time, chunk size bounded by `DelayBoundK`). Measured in process, without the websocket
transport, on one engine whose compiled executables every mode reuses.
"""

import dataclasses
import threading
import time

import numpy as np

from oxygen_jax.engine.engine import Engine
from oxygen_jax.runtime import runtime
from oxygen_jax.runtime.device_loop import ActionReply, ObservationWork
from oxygen_jax.runtime.requests import TextRequest, TextResult
from oxygen_jax.runtime.runtime import Runtime, RuntimeConfig
from oxygen_jax.runtime.scheduler import FrameInput

MODES = ("action_only", "frame", "async")


@dataclasses.dataclass(frozen=True)
class Setting:
    robots: int
    think_ms: float
    max_new: int = 30
    frame_k: int = 4
    max_batch: int = 4
    gather_ms: float = 5.0
    seconds: float = 20.0

    @property
    def name(self) -> str:
        return f"R{self.robots}_T{self.think_ms:g}"


class _Robot(threading.Thread):
    def __init__(self, index: int, loop: Runtime, observations: list, setting: Setting, language: bool):
        super().__init__(name=f"robot-{index}", daemon=True)
        self.index, self.loop, self.observations, self.setting, self.language = (
            index,
            loop,
            observations,
            setting,
            language,
        )
        self.stop = threading.Event()
        self.latencies: list[float] = []
        self.text_latencies: list[float] = []
        self.finished_tokens = 0
        self.observations_sent = 0
        self.texts_started = 0
        self._text_busy = False
        self._replied = threading.Event()
        self._reply_at = 0.0

    def run(self) -> None:
        step = 0
        while not self.stop.is_set():
            received = time.perf_counter()
            requests = []
            if self.language and not self._text_busy:
                self._text_busy = True
                self.texts_started += 1
                on_done = self._text_done(received)
                request_id = self.index * 1_000_000 + step
                requests.append(TextRequest(request_id, self.setting.max_new, on_done=on_done))
            arrays = self.observations[(self.index + step) % len(self.observations)]
            self._replied.clear()
            self.loop.submit(ObservationWork(FrameInput(arrays, None, requests), self._on_reply, self.index))
            self._replied.wait()
            self.latencies.append(self._reply_at - received)
            self.observations_sent += 1
            step += 1
            time.sleep(self.setting.think_ms / 1e3)

    def _on_reply(self, reply: ActionReply) -> None:
        if reply.error is not None:
            raise reply.error
        self._reply_at = time.perf_counter()
        self._replied.set()

    def _text_done(self, received: float):
        def on_done(result: TextResult) -> None:
            self.text_latencies.append(time.perf_counter() - received)
            self.finished_tokens += len(result.tokens)
            self._text_busy = False

        return on_done


def _percentile_ms(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q) * 1e3) if values else None


def run_mode(engine: Engine, observations: list, mode: str, setting: Setting, num_steps: int) -> dict:
    """One mode at one setting: warm up (compiled shapes are reused across calls), serve the robots for
    `setting.seconds`, return the metrics."""
    language = mode != "action_only"
    data = engine.data_size  # slots split evenly over the mesh's data axis
    config = RuntimeConfig(
        max_slots=-(-setting.robots // data) * data if language else 0,
        max_new_tokens=setting.max_new,
        loop="frame" if mode == "frame" else "async",
        k=setting.frame_k,
        owed_k=setting.frame_k,
        num_steps=num_steps,
        max_prefill_batch=setting.max_batch,
        gather_s=setting.gather_ms / 1e3,
    )
    loop = runtime.build(engine, config, expected_senders=lambda: setting.robots)
    loop.warmup(observations[0])
    loop.start()
    robots = [_Robot(i, loop, observations, setting, language) for i in range(setting.robots)]
    start = time.perf_counter()
    for robot in robots:
        robot.start()
    time.sleep(setting.seconds)
    for robot in robots:
        robot.stop.set()
    for robot in robots:
        robot.join()
    wall = time.perf_counter() - start
    stats = loop.stats
    busy = stats.busy_fraction()
    loop.stop()
    latencies = [x for r in robots for x in r.latencies]
    text_latencies = [x for r in robots for x in r.text_latencies]
    sent = sum(r.observations_sent for r in robots)
    return {
        "mode": mode,
        "observations": sent,
        "action_latency_ms_p50": _percentile_ms(latencies, 50),
        "action_latency_ms_p99": _percentile_ms(latencies, 99),
        "text_latency_ms_p50": _percentile_ms(text_latencies, 50),
        "text_latency_ms_p99": _percentile_ms(text_latencies, 99),
        "tokens_per_s": sum(r.finished_tokens for r in robots) / wall,
        "own_text_fraction": sum(r.texts_started for r in robots) / max(sent, 1) if language else 0.0,
        "busy_fraction": busy,
        "mean_decode_batch": stats.chunk_rows / stats.chunk_steps if stats.chunk_steps else None,
        "decode_tokens_per_s": stats.chunk_rows / stats.decode_s if stats.decode_s else None,
        "mean_chunk_k": stats.chunk_steps / stats.chunks if stats.chunks else None,
        "wall_s": wall,
    }


def run_setting(engine: Engine, observations: list, setting: Setting, num_steps: int) -> dict:
    """Every mode at one setting. The idle decode capacity is the async run's decode rate (tokens/s at
    its observed batch) times the fraction of time the device is idle when it serves actions only."""
    results = {mode: run_mode(engine, observations, mode, setting, num_steps) for mode in MODES}
    rate = results["async"]["decode_tokens_per_s"] or 0.0
    capacity = rate * (1.0 - results["action_only"]["busy_fraction"])
    for result in results.values():
        result["idle_decode_tokens_per_s"] = capacity
    return {"setting": dataclasses.asdict(setting), "modes": results}
