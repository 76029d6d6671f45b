"""scripts/benchmark.py --serving --ray on pi05_tiny: the plain server and a one-replica fleet each answer
every robot without error and report the documented fields. Counts and fields only: timings on a shared
machine mean nothing."""

import json

import pytest
from conftest import run_benchmark

pytest.importorskip("ray.serve")


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_fleet_benchmark_serves_every_robot_on_the_plain_server_and_through_the_ray_proxy(tmp_path):
    run_benchmark(
        tmp_path,
        "--serving",
        "--ray",
        "--replicas=1",
        "--fleet_robots=2",
        "--config=pi05_tiny",
        "--serving_seconds=2",
    )
    result = json.loads((tmp_path / "fleet_pi05_tiny.json").read_text())
    assert set(result["servers"]) == {"plain", "ray_1"}
    for name, server in result["servers"].items():
        (load,) = server["loads"]
        assert load["robots"] == 2 and load["replies"] > 0 and load["errors"] == 0, name
        assert load["p50_ms"] <= load["p99_ms"]
        (memory,) = server["memory_mb"].values()
        assert memory > 100, name  # a process holding jax and the model
    fleet = result["servers"]["ray_1"]
    proxied, direct = fleet["proxied_one_robot"], fleet["direct_one_robot"]
    for one_robot in (proxied, direct):
        assert one_robot["replies"] > 0 and one_robot["errors"] == 0
    assert direct["replica_ids"] == proxied["replica_ids"]  # the same replica, past the proxy
    assert "proxy_p50_added_ms" in fleet
