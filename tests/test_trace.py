"""The profiler-trace summary the GPU lab reports per phase, on small hand-written perfetto traces."""

import gzip
import json

import pytest

from oxygen_jax.benchmarks import trace


def _meta(pid, tid=None, process=None, thread=None):
    if process:
        return {"ph": "M", "name": "process_name", "pid": pid, "args": {"name": process}}
    return {"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": thread}}


def _op(pid, tid, name, ts, dur):
    return {"ph": "X", "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur}


GPU_EVENTS = [
    _meta(1, process="/host:CPU"),
    _meta(1, 5, thread="python"),
    _op(1, 5, "PjitFunction(act)", 0, 1000),  # host side: not a kernel
    _meta(2, process="/device:GPU:0"),
    _meta(2, 7, thread="Stream #7"),
    _meta(2, 8, thread="Stream #8"),
    _op(2, 7, "gemm_a", 0, 300),
    _op(2, 8, "gemm_a", 200, 300),  # overlaps the first: the union counts 0..500 once
    _op(2, 7, "fusion_b", 600, 100),
    _op(2, 7, "gemm_a", 800, 100),
]


def test_device_kernels_counted_busy_union_and_top():
    s = trace.summarize(GPU_EVENTS, calls=2, wall_s=1e-3)
    assert s["where"] == "device"
    assert s["kernels_per_call"] == 2.0  # 4 kernels over 2 calls
    assert s["busy_fraction"] == pytest.approx(0.7)  # 0-500, 600-700, 800-900 of 1000 us
    assert s["kernel_ms_per_call"] == pytest.approx(0.4)  # 800 us of kernels over 2 calls
    assert [k["name"] for k in s["top"]] == ["gemm_a", "fusion_b"]
    assert s["top"][0]["share"] == pytest.approx(700 / 800)


def test_cpu_trace_counts_xla_ops_on_the_client_thread_as_host_kernels(tmp_path):
    events = [
        _meta(1, process="/host:CPU"),
        _meta(1, 5, thread="python"),
        _meta(1, 6, thread="tf_XLAPjRtCpuClient/123"),
        _op(1, 5, "broadcast_add_fusion", 0, 50),  # python thread: not an op
        _op(1, 6, "ynn_fusion", 0, 40),
        _op(1, 6, "end: ynn_fusion", 40, 1),
        _op(1, 6, "ThunkExecutor::Execute (wait for completion)", 0, 60),
        _op(1, 6, "broadcast_add_fusion", 50, 10),
    ]
    path = tmp_path / "plugins" / "profile" / "run" / "perfetto_trace.json.gz"
    path.parent.mkdir(parents=True)
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": events}, f)
    s = trace.summarize(trace.load_events(trace.find_trace(tmp_path)), calls=1, wall_s=1e-4)
    assert s["where"] == "host"
    assert s["kernels_per_call"] == 2
    assert s["busy_fraction"] == pytest.approx(0.5)


def test_missing_trace_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="perfetto_trace"):
        trace.find_trace(tmp_path)
