"""One process of a two-process run of the tiny golden model on a data:4 mesh over both processes'
devices (2 each), joined through `jax.distributed` on loopback; process 0 writes the actions.

Run by tests/test_distributed.py: python tests/distributed_run.py <port> <process_id> <out.npz>
with XLA_FLAGS=--xla_force_host_platform_device_count=2.
"""

import sys

import jax
import numpy as np
from conftest import GOLDEN, golden_inputs
from jax.experimental import multihost_utils

from oxygen_jax import checkpoints, config
from oxygen_jax.engine import mesh as mesh_lib
from oxygen_jax.engine.engine import Engine
from oxygen_jax.models import inputs

ROWS = 4


def main(port: str, process_id: str, out: str) -> None:
    jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=int(process_id))
    cfg = config.model_config(config.load_config("pi05_tiny"))
    params = checkpoints.restore_params(GOLDEN / "checkpoint")
    golden = golden_inputs(np.load(GOLDEN / "model_io.npz"))
    obs = inputs.observation_from_arrays({k: np.concatenate([v, v]) for k, v in golden.items()}, cfg)
    noise = np.random.default_rng(0).standard_normal((ROWS, cfg.action_horizon, cfg.action_dim), np.float32)
    engine = Engine(params, cfg, mesh=mesh_lib.mesh_from_spec("data:4"))
    cache = engine.prefill(obs)
    actions = multihost_utils.process_allgather(engine.denoise(cache, noise), tiled=True)
    text = multihost_utils.process_allgather(engine.generate(cache, 6).tokens, tiled=True)
    if jax.process_index() == 0:
        np.savez(
            out,
            actions=actions,
            text=text,
            noise=noise,
            devices=jax.device_count(),
            processes=jax.process_count(),
        )
    jax.distributed.shutdown()


if __name__ == "__main__":
    main(*sys.argv[1:])
