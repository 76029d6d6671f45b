"""Fine-tune pi0.5 with openpi's recipe, or evaluate the training loss on one batch.

  # train on a LeRobot dataset folder, starting from an openpi checkpoint; resumes if RUN has steps
  oxygen-train --config=pi05_demo --dataset=DATA --run_dir=RUN [--checkpoint_dir=CKPT]
  # fine-tune a trained model on a new task: its params (shapes as the config's), the dataset's norm stats
  oxygen-train --config=pi05_detour_moving --dataset=DATA --run_dir=RUN --init_from=CKPT
  # train on a tiny synthetic set (no dataset needed)
  oxygen-train --config=pi05_tiny --synthetic --run_dir=RUN --train_steps=20
  # loss terms and gradient norm on a batch given in train_io's `in/...` keys (noise and time included)
  oxygen-train --config=pi05_tiny --config.model.prefix_attention=causal_text \
      --config.training.text_loss_weight=1 --checkpoint_dir=CKPT --loss_on=BATCH.npz --out=LOSS.npz
  # the demo model (the shipped one, or --checkpoint_dir=RUN) and the untrained one on held-out scenes
  oxygen-train --config=pi05_demo --eval_only --out=DIR     # writes DIR/demo_eval.json

Default config: pi05_demo, the demo model shipped in the package (docs/cli.md).
Training plots its loss with matplotlib (the `train` extra brings it).

The recipe, the loss weights, LoRA and freezing are the config's `training` section (override with
`--config.training.peak_lr=1e-4` etc.); see docs/training.md. A run writes `RUN/<step>/params` +
`RUN/<step>/assets/<asset_id>/norm_stats.json` (openpi's layout: `infer.py --checkpoint_dir=RUN` and
`serve.py` load it), `RUN/metrics.jsonl` and `RUN/loss.png`.
"""

import functools
import json
import pathlib

import jax
import numpy as np
import optax
from absl import flags

from oxygen_jax import checkpoints, preflight
from oxygen_jax import config as config_lib
from oxygen_jax.models import inputs, pi05
from oxygen_jax.params import load_params
from oxygen_jax.policies.normalization import load_norm_stats
from oxygen_jax.table_task import scoring
from oxygen_jax.tools import cli
from oxygen_jax.training import loop, synthetic
from oxygen_jax.training.batch import batch_from_arrays
from oxygen_jax.training.loss import mean_loss
from oxygen_jax.training.train_step import TrainSpec

_CONFIG = cli.define_config_flag("pi05_demo")
_CHECKPOINT = cli.define_checkpoint_dir_flag(
    "openpi checkpoint to start from (random init when absent) or to evaluate (--eval_only: the "
    "config's own when absent)."
)
_INIT_FROM = flags.DEFINE_string(
    "init_from",
    None,
    "Checkpoint whose params training starts from, shapes checked against the config's model; unlike "
    "--checkpoint_dir, norm stats come from the dataset (a trained model fine-tuned on a new task).",
)
_TOKENIZER = cli.define_tokenizer_path_flag()
_PARAMS_DTYPE = cli.define_params_dtype_flag("float32")
_SEED = flags.DEFINE_integer("seed", None, "Seed for init, data order and noise (config's seed when absent).")
_RUN_DIR = flags.DEFINE_string("run_dir", None, "Where the run writes checkpoints, metrics and the plot.")
_DATASET = flags.DEFINE_string("dataset", None, "LeRobot dataset folder (columns from the config's data).")
_SYNTHETIC = flags.DEFINE_bool("synthetic", False, "Train on a tiny synthetic set instead of a dataset.")
_TRAIN_STEPS = flags.DEFINE_integer(
    "train_steps", None, "Train until this step (config's training.num_train_steps).", lower_bound=1
)
_LOSS_ON = flags.DEFINE_string("loss_on", None, "npz batch (train_io `in/...` keys) to evaluate the loss on.")
_OUT = flags.DEFINE_string(
    "out",
    None,
    "npz for --loss_on: loss, loss_flow, loss_ce [B], loss_mean, grad_norm; folder for --eval_only.",
)
_EVAL_ONLY = flags.DEFINE_bool(
    "eval_only",
    False,
    "Table demo configs: score the checkpoint (the config's own without --checkpoint_dir) and the untrained "
    "model on held-out scenes into OUT/demo_eval.json.",
)
_EPISODES = flags.DEFINE_integer(
    "episodes", 100, "Held-out scenes (an episode each) for --eval_only.", lower_bound=1
)


def _eval_only(cfg) -> None:
    if not _OUT.value:
        cli.fail("--eval_only needs --out=DIR")
    if cfg.robot != "table":
        cli.fail(f"--eval_only scores the table demo task; config {cfg.name!r} has robot {cfg.robot!r}")
    preflight.model(cfg, _CHECKPOINT.value, None)
    preflight.writable(_OUT.value, folder=True)
    episodes = _EPISODES.value
    try:
        report = scoring.eval_report(cfg, _CHECKPOINT.value, episodes)
    except (ValueError, FileNotFoundError) as e:
        cli.fail(str(e))
    out = pathlib.Path(_OUT.value)
    out.mkdir(parents=True, exist_ok=True)
    (out / "demo_eval.json").write_text(json.dumps(report, indent=2) + "\n")
    for name in ("trained", "untrained"):
        r = report[name]
        print(
            f"{name:9s}: subtask exact match {r['subtask_exact_match']:.3f}, action MSE {r['action_mse']:.5f}"
        )
    print(f"action MSE ratio {report['action_mse_ratio']:.4f} over {episodes} held-out scenes")
    print(f"wrote {out / 'demo_eval.json'}")


def _loss_on(cfg) -> None:
    if not _OUT.value:
        cli.fail("--loss_on needs --out")
    preflight.checkpoint(_CHECKPOINT.value)
    preflight.numpy_file(_LOSS_ON.value, _LOSS_ON.name)
    preflight.writable(_OUT.value, folder=False)
    with np.load(_LOSS_ON.value) as npz:
        arrays = {k.removeprefix("in/"): npz[k] for k in npz.files if not k.startswith("in/image_u8/")}
    if "real_action_dim" in arrays:
        cfg.training.real_action_dim = int(arrays.pop("real_action_dim"))
    spec = TrainSpec.from_config(cfg)
    try:
        batch = batch_from_arrays(arrays, spec.model)
    except inputs.InputError as e:
        cli.fail(f"{_LOSS_ON.value}: {e}")
    params = load_params(
        spec.model, _CHECKPOINT.value, seed=cfg.seed, dtype=cli.params_dtype_value(_PARAMS_DTYPE)
    )
    grad_fn = jax.jit(
        jax.value_and_grad(
            functools.partial(mean_loss, config=spec.model, loss_config=spec.loss), has_aux=True
        )
    )
    try:
        (mean, terms), grads = grad_fn(params, batch=batch, rng=jax.random.key(cfg.seed))
    except ValueError as e:
        cli.fail(str(e))
    out = {
        "loss": terms.loss,
        "loss_flow": terms.loss_flow,
        "loss_ce": terms.loss_ce,
        "loss_mean": mean,
        "grad_norm": optax.tree.norm(grads),
    }
    np.savez(_OUT.value, **{k: np.asarray(v) for k, v in out.items()})
    print(
        f"loss {np.asarray(terms.loss)} (flow {np.asarray(terms.loss_flow)}, ce {np.asarray(terms.loss_ce)})"
    )
    print(f"loss_mean {float(mean):.6f}  grad_norm {float(out['grad_norm']):.6f}  -> {_OUT.value}")


def _norm_stats(cfg):
    """The start checkpoint's norm stats for the config's asset id, else ones computed from the dataset."""
    if _CHECKPOINT.value and cfg.asset_id:
        try:
            return load_norm_stats(checkpoints.norm_stats_path(_CHECKPOINT.value, cfg.asset_id))
        except FileNotFoundError:
            pass
    if _DATASET.value:
        from oxygen_jax.training.data.from_config import dataset_norm_stats

        return dataset_norm_stats(cfg, _DATASET.value)
    return None


def _batches(cfg, norm_stats):
    batch_size = cfg.training.batch_size
    if _SYNTHETIC.value:
        model_config = config_lib.model_config(cfg)
        dataset = synthetic.synthetic_dataset(model_config, size=max(8, batch_size), seed=cfg.seed)
        return synthetic.synthetic_batches(dataset, batch_size, seed=cfg.seed)
    from oxygen_jax.training.data.from_config import train_examples

    examples = train_examples(cfg, _DATASET.value, norm_stats)
    return examples.batches(batch_size, seed=cfg.seed, text_fraction=cfg.data.text_fraction)


def _train(cfg) -> None:
    if not _RUN_DIR.value:
        cli.fail("training needs --run_dir (or --loss_on to evaluate the loss)")
    if _SYNTHETIC.value == bool(_DATASET.value):
        cli.fail("give exactly one of --dataset=DIR and --synthetic")
    if _CHECKPOINT.value and _INIT_FROM.value:
        cli.fail("give at most one of --checkpoint_dir and --init_from")
    start = _CHECKPOINT.value or _INIT_FROM.value
    preflight.checkpoint(start)
    if _DATASET.value:
        preflight.extra("pyarrow", "train", "reading a LeRobot dataset (--dataset)")
        preflight.tokenizer_file(cfg.tokenizer_path)
    preflight.extra("matplotlib", "train", "plotting the training loss (RUN/loss.png)")
    preflight.writable(_RUN_DIR.value, folder=True)
    model_config = config_lib.model_config(cfg)

    def init_params():
        if not start:
            return pi05.init_params(model_config, jax.random.key(cfg.seed))
        try:
            return load_params(model_config, start, dtype=cli.params_dtype_value(_PARAMS_DTYPE))
        except checkpoints.CheckpointMismatchError as e:
            cli.fail(f"{start} does not fit config {cfg.name!r}: {e}")

    norm_stats = _norm_stats(cfg)
    try:
        loop.train(
            cfg,
            _batches(cfg, norm_stats),
            run_dir=_RUN_DIR.value,
            init_params=init_params,
            norm_stats=norm_stats,
            num_steps=_TRAIN_STEPS.value,
        )
    except (ValueError, FileNotFoundError, inputs.InputError) as e:
        cli.fail(str(e))
    print(f"run written to {_RUN_DIR.value} (serve it with --checkpoint_dir={_RUN_DIR.value})")


def main(_):
    cfg = _CONFIG.value
    if _SEED.value is not None:
        cfg.seed = _SEED.value
    if _TOKENIZER.value:
        cfg.tokenizer_path = _TOKENIZER.value
    if _LOSS_ON.value:
        _loss_on(cfg)
    elif _EVAL_ONLY.value:
        _eval_only(cfg)
    else:
        _train(cfg)


def run() -> None:
    """The `oxygen-train` command."""
    cli.run(main)


if __name__ == "__main__":
    run()
