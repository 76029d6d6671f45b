"""The training loop: batches in, checkpoints, metrics and a loss plot out; resumes a run where it stopped.

    state = train(cfg, batches, run_dir="runs/demo", init_params=lambda: params, norm_stats=stats)

- `batches` yields dicts of numpy arrays in `training.batch` keys (a LeRobot reader's examples, or
  `training.synthetic`); each is validated, split over the devices along the batch axis
  (`jax.sharding`, a 1-D "data" mesh over every device: data parallelism, params replicated) and fed
  to the jitted `train_step`.
- A run dir that already holds a step resumes from the newest one (params, optimizer state, EMA, step);
  `init_params` is then never called. Otherwise `init_params()` gives the starting params (openpi's
  stacked tree, e.g. an openpi checkpoint restored as float32).
- Every `training.log_interval` steps the metrics averaged over the interval go to the tqdm bar and to
  `<run_dir>/metrics.jsonl` (with `step_s`, seconds per step, compilation included in the first);
  every `training.save_interval` steps and at the end a checkpoint (checkpointing.py); at the end
  `<run_dir>/loss.png`.
"""

import os
import pathlib
import time
from collections.abc import Callable, Iterator, Mapping, Sequence

import jax
import ml_collections
import numpy as np
import tqdm
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from oxygen_jax.models import pi05
from oxygen_jax.policies.normalization import NormStats
from oxygen_jax.training import checkpointing, metrics
from oxygen_jax.training.batch import TrainBatch, batch_from_arrays
from oxygen_jax.training.train_step import TrainSpec, TrainState, init_train_state, train_step

METRICS_FILE = "metrics.jsonl"
PLOT_FILE = "loss.png"
DATA_AXIS = "data"


def data_mesh(devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A 1-D mesh over `devices` (default: all) whose axis splits the batch."""
    return Mesh(np.asarray(devices if devices is not None else jax.devices()), (DATA_AXIS,))


def shard_batch(batch: TrainBatch, mesh: Mesh) -> TrainBatch:
    """The batch split along axis 0 over the mesh (its size must divide evenly)."""
    if batch.size % mesh.size:
        raise ValueError(f"batch size {batch.size} must be divisible by the number of devices {mesh.size}")
    return jax.device_put(batch, NamedSharding(mesh, PartitionSpec(DATA_AXIS)))


def replicate(tree, mesh: Mesh):
    return jax.device_put(tree, NamedSharding(mesh, PartitionSpec()))


def start_state(
    run_dir: str | os.PathLike[str], spec: TrainSpec, init_rng: jax.Array, init_params: Callable[[], dict]
) -> TrainState:
    """The newest checkpointed state of the run, or a fresh one from `init_params()`."""
    if checkpointing.latest_step(run_dir) is None:
        return init_train_state(init_params(), spec, init_rng)
    like = jax.eval_shape(lambda p: init_train_state(p, spec, init_rng), pi05.param_shapes(spec.model))
    return checkpointing.restore_train_state(run_dir, like)


def train(
    cfg: ml_collections.ConfigDict,
    batches: Iterator[Mapping[str, np.ndarray]],
    *,
    run_dir: str | os.PathLike[str],
    init_params: Callable[[], dict],
    norm_stats: Mapping[str, NormStats] | None = None,
    num_steps: int | None = None,
    devices: Sequence[jax.Device] | None = None,
) -> TrainState:
    """Trains until step `num_steps` (default `training.num_train_steps`); returns the final state."""
    t = cfg.training
    spec = TrainSpec.from_config(cfg)
    run_dir = pathlib.Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    init_rng, train_rng = jax.random.split(jax.random.key(cfg.seed))
    mesh = data_mesh(devices)
    state = replicate(start_state(run_dir, spec, init_rng, init_params), mesh)
    num_steps = t.num_train_steps if num_steps is None else num_steps
    start = int(state.step)
    logged, last_log = [], time.perf_counter()

    bar = tqdm.tqdm(range(start, num_steps), initial=start, total=num_steps, desc="train", dynamic_ncols=True)
    for step in bar:
        batch = shard_batch(batch_from_arrays(next(batches), spec.model), mesh)
        state, step_metrics = train_step(state, batch, train_rng, spec=spec)
        logged.append(step_metrics)
        done = step + 1
        if done % t.log_interval == 0 or done == num_steps:
            host = jax.device_get(logged)
            means = {k: float(np.mean([m[k] for m in host])) for k in host[0]}
            now = time.perf_counter()
            means["step_s"] = (now - last_log) / len(logged)
            logged, last_log = [], now
            metrics.append_metrics(run_dir / METRICS_FILE, done, means)
            bar.set_postfix(
                loss=f"{means['loss']:.4f}", flow=f"{means['loss_flow']:.4f}", ce=f"{means['loss_ce']:.4f}"
            )
        if done % t.save_interval == 0 or done == num_steps:
            checkpointing.save_checkpoint(
                run_dir,
                state,
                spec,
                norm_stats=norm_stats,
                asset_id=cfg.asset_id,
                keep_period=t.keep_period,
            )
    if (run_dir / METRICS_FILE).is_file():
        metrics.plot_losses(run_dir / METRICS_FILE, run_dir / PLOT_FILE)
    return state
