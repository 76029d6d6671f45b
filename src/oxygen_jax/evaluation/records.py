"""Results files: per-episode timing and language fields, written atomically after every episode."""

import json
import pathlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from oxygen_jax.evaluation.chunking import Replan
from oxygen_jax.evaluation.pacing import RateMeter


def episode_record(replans: Sequence[Replan], meter: RateMeter) -> dict[str, Any]:
    """The timing and language fields every loop's per-episode results share."""
    latencies = [r.latency_ms for r in replans]
    return {
        "steps": meter.steps,
        "control_hz": round(meter.hz, 3),
        "replans": len(replans),
        "infer_ms": latency_summary(latencies),
        "texts": [{"step": r.step, "text": r.text} for r in replans if r.text is not None],
    }


def latency_summary(latencies_ms: Sequence[float]) -> dict[str, float] | None:
    if not latencies_ms:
        return None
    values = np.asarray(latencies_ms)
    # The first call includes compilation, so the median is the steady-state number to read.
    return {
        "first": round(float(values[0]), 2),
        "median": round(float(np.median(values)), 2),
        "p95": round(float(np.percentile(values, 95)), 2),
        "max": round(float(values.max()), 2),
    }


def add_episode(
    results: dict[str, Any],
    record: dict[str, Any],
    summarize: Callable[[list[dict]], dict],
    out_dir: pathlib.Path,
) -> None:
    """Adds an episode's record and the summary of all episodes so far to `results`, and rewrites
    `out_dir/results.json` with them."""
    results["episodes"].append(record)
    results["summary"] = summarize(results["episodes"])
    write_json(out_dir / "results.json", results)


def write_json(path: pathlib.Path, data: Mapping[str, Any]) -> None:
    """Written atomically after every episode, so an interrupted run keeps what it measured."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=_to_json) + "\n")
    tmp.replace(path)


def _to_json(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, pathlib.Path):
        return str(value)
    raise TypeError(f"not JSON-serializable: {type(value).__name__}")
