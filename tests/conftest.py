"""Shared fixtures: the golden reference data computed by upstream openpi on the tiny model."""

import importlib.util
import pathlib
import socket
import subprocess
import sys
import types

import numpy as np
import pytest

from oxygen_jax import checkpoints, config
from oxygen_jax.models import inputs

GOLDEN = pathlib.Path(__file__).resolve().parents[2] / "shared" / "golden"
SCRIPTS = pathlib.Path(__file__).resolve().parents[1] / "scripts"
# Four CPU devices for mesh tests; JAX reads the flag at import, so only a subprocess can take it.
FORCED_DEVICES = {"XLA_FLAGS": "--xla_force_host_platform_device_count=4", "JAX_PLATFORMS": "cpu"}


def load_script(name: str) -> types.ModuleType:
    """`scripts/<name>.py` as a module (scripts are not a package; tests call their functions)."""
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the script runs
    spec.loader.exec_module(module)
    return module


def run_benchmark(out: pathlib.Path, *flags: str) -> None:
    """scripts/benchmark.py with `flags`, writing to `out` with its own compilation cache; fails the test
    with the script's stderr when it fails."""
    script = SCRIPTS / "benchmark.py"
    cmd = [sys.executable, str(script), *flags, f"--out={out}", f"--jax_cache_dir={out / 'xla'}"]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
    assert run.returncode == 0, run.stderr[-4000:]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def golden_inputs(npz) -> dict:
    """model_io-style `in/...` arrays as model-level keys (without the `in/` prefix)."""
    return {k[3:]: npz[k] for k in npz.files if k.startswith("in/") and not k.startswith("in/image_u8/")}


@pytest.fixture(scope="session")
def tiny_config():
    return config.model_config(config.load_config("pi05_tiny"))


@pytest.fixture(scope="session")
def golden_params():
    return checkpoints.restore_params(GOLDEN / "checkpoint")


@pytest.fixture(scope="session")
def model_io():
    return np.load(GOLDEN / "model_io.npz")


@pytest.fixture(scope="session")
def golden_obs(model_io, tiny_config):
    return inputs.observation_from_arrays(golden_inputs(model_io), tiny_config)
