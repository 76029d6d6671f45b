"""Multi-host: two processes joined by jax.distributed on loopback serve one data:4 mesh (2 CPU devices
each) and give the single-device actions and text."""

import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
from conftest import GOLDEN, free_port, golden_inputs

from oxygen_jax.engine.engine import Engine
from oxygen_jax.models import inputs

RUNNER = pathlib.Path(__file__).with_name("distributed_run.py")


@pytest.mark.slow
def test_two_processes_on_one_mesh_equal_one_device(tmp_path, tiny_config, golden_params):
    out = tmp_path / "results.npz"
    env = os.environ | {
        "XLA_FLAGS": "--xla_force_host_platform_device_count=2",
        "JAX_PLATFORMS": "cpu",
        "PYTHONPATH": os.pathsep.join([str(RUNNER.parent), *sys.path]),
    }
    port = str(free_port())
    processes = [
        subprocess.Popen([sys.executable, str(RUNNER), port, str(i), str(out)], env=env) for i in range(2)
    ]
    assert [p.wait(timeout=600) for p in processes] == [0, 0]
    results = np.load(out)
    assert (int(results["processes"]), int(results["devices"])) == (2, 4)

    golden = golden_inputs(np.load(GOLDEN / "model_io.npz"))
    obs = inputs.observation_from_arrays({k: np.concatenate([v, v]) for k, v in golden.items()}, tiny_config)
    engine = Engine(golden_params, tiny_config)
    cache = engine.prefill(obs)
    actions = np.asarray(engine.denoise(cache, results["noise"]))
    np.testing.assert_allclose(results["actions"], actions, rtol=0, atol=1e-5 * np.abs(actions).max())
    np.testing.assert_array_equal(results["text"], np.asarray(engine.generate(cache, 6).tokens))
