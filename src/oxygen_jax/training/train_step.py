"""The train state and one jitted optimizer step (openpi's `train_step`, as pure functions over pytrees).

    spec = TrainSpec.from_config(cfg)
    state = init_train_state(params, spec, rng)          # params: openpi's stacked tree
    state, metrics = train_step(state, batch, rng, spec=spec)   # jitted, state donated
    serving_params(state, spec)                           # what a checkpoint's params/ holds

The params split into `trainable` (differentiated, updated by the optimizer, EMA-tracked) and `frozen`
(config `training.freeze` regex over "/"-joined paths, plus openpi's LoRA freeze rule): gradients are
taken with respect to the trainable leaves only, and frozen leaves are stored in `frozen_dtype`
(bfloat16, as openpi converts them) and never change. The EMA (`ema_decay`, None: off) covers the
trainable leaves; a constant's average is itself, so frozen leaves are shared rather than averaged.
The step's rng is `fold_in(rng, step)` (openpi), from which the loss draws its noise and time unless the
batch carries them.
"""

import dataclasses
import functools
import re

import flax.struct
import jax
import jax.numpy as jnp
import ml_collections
import optax
from flax import traverse_util

from oxygen_jax import config as config_lib
from oxygen_jax.models import pi05
from oxygen_jax.training import lora, loss, optimizer
from oxygen_jax.training.batch import TrainBatch
from oxygen_jax.training.lora import LoraConfig
from oxygen_jax.training.loss import LossConfig
from oxygen_jax.training.optimizer import OptimizerConfig


@dataclasses.dataclass(frozen=True)
class TrainSpec:
    """Everything static about a training run (hashable: the jit cache key of `train_step`)."""

    model: pi05.Pi05Config
    loss: LossConfig = dataclasses.field(default_factory=LossConfig)
    optimizer: OptimizerConfig = dataclasses.field(default_factory=OptimizerConfig)
    lora: LoraConfig = dataclasses.field(default_factory=LoraConfig)
    ema_decay: float | None = None
    freeze: str = ""
    frozen_dtype: str | None = "bfloat16"

    @classmethod
    def from_config(cls, cfg: ml_collections.ConfigDict) -> "TrainSpec":
        t = cfg.training
        return cls(
            model=config_lib.model_config(cfg),
            loss=LossConfig(
                text_loss_weight=t.text_loss_weight,
                action_loss_weight=t.action_loss_weight,
                real_action_dim=t.real_action_dim or None,
            ),
            optimizer=OptimizerConfig.from_training(t),
            lora=LoraConfig(t.lora_paligemma_rank, t.lora_action_expert_rank),
            ema_decay=t.ema_decay,
            freeze=t.freeze,
            frozen_dtype=t.frozen_dtype,
        )

    def is_frozen(self, path: str) -> bool:
        return bool(self.freeze and re.fullmatch(self.freeze, path)) or lora.frozen_by_lora(path, self.lora)


@flax.struct.dataclass
class TrainState:
    step: jax.Array
    trainable: dict
    frozen: dict
    opt_state: optax.OptState
    ema: dict | None


def _split(params: dict, spec: TrainSpec) -> tuple[dict, dict]:
    trainable, frozen = {}, {}
    for path, leaf in traverse_util.flatten_dict(params, sep="/").items():
        if spec.is_frozen(path):
            frozen[path] = leaf if spec.frozen_dtype is None else leaf.astype(spec.frozen_dtype)
        else:
            trainable[path] = leaf
    if not trainable:
        raise ValueError(f"every parameter is frozen (freeze={spec.freeze!r}, {spec.lora}); nothing to train")
    return traverse_util.unflatten_dict(trainable, sep="/"), traverse_util.unflatten_dict(frozen, sep="/")


def _join(trainable: dict, frozen: dict) -> dict:
    flat = {**traverse_util.flatten_dict(frozen), **traverse_util.flatten_dict(trainable)}
    return traverse_util.unflatten_dict(flat)


def init_train_state(params: dict, spec: TrainSpec, rng: jax.Array) -> TrainState:
    """A step-0 state from openpi-layout params (LoRA leaves drawn from rng when the spec asks)."""
    if spec.lora.enabled:
        params = lora.add_lora(params, spec.lora, rng)
    params = jax.tree.map(jnp.asarray, params)
    trainable, frozen = _split(params, spec)
    return TrainState(
        step=jnp.zeros((), jnp.int32),
        trainable=trainable,
        frozen=frozen,
        opt_state=optimizer.create_optimizer(spec.optimizer).init(trainable),
        ema=None if spec.ema_decay is None else jax.tree.map(jnp.copy, trainable),
    )


def model_params(trainable: dict, frozen: dict, spec: TrainSpec) -> dict:
    """The tree the model runs on: trainable and frozen leaves together, LoRA merged."""
    return lora.merge_lora(_join(trainable, frozen), spec.lora)


def serving_params(state: TrainState, spec: TrainSpec) -> dict:
    """What inference loads: the EMA params when tracked (openpi saves those), else the current ones."""
    return model_params(state.trainable if state.ema is None else state.ema, state.frozen, spec)


def _loss_fn(trainable: dict, frozen: dict, batch: TrainBatch, rng: jax.Array, spec: TrainSpec):
    return loss.mean_loss(model_params(trainable, frozen, spec), spec.model, batch, rng, spec.loss)


def loss_and_grads(
    state: TrainState, batch: TrainBatch, rng: jax.Array | None, spec: TrainSpec
) -> tuple[tuple[jax.Array, loss.LossTerms], dict]:
    """((batch-mean loss, per-example terms), gradients of the trainable leaves)."""
    return jax.value_and_grad(_loss_fn, has_aux=True)(state.trainable, state.frozen, batch, rng, spec)


@functools.partial(jax.jit, static_argnames=("spec",), donate_argnames=("state",))
def train_step(
    state: TrainState, batch: TrainBatch, rng: jax.Array, *, spec: TrainSpec
) -> tuple[TrainState, dict[str, jax.Array]]:
    """One optimizer step. Returns (new state, batch-mean metrics: loss terms, grad norm, lr)."""
    step_rng = jax.random.fold_in(rng, state.step)
    (mean, terms), grads = loss_and_grads(state, batch, step_rng, spec)
    tx = optimizer.create_optimizer(spec.optimizer)
    updates, opt_state = tx.update(grads, state.opt_state, state.trainable)
    trainable = optax.apply_updates(state.trainable, updates)
    ema = state.ema
    if ema is not None:
        decay = spec.ema_decay
        ema = jax.tree.map(lambda old, new: decay * old + (1 - decay) * new, ema, trainable)
    metrics = {
        "loss": mean,
        "loss_flow": jnp.mean(terms.loss_flow),
        "loss_ce": jnp.mean(terms.loss_ce),
        "grad_norm": optax.tree.norm(grads),
        "lr": optimizer.lr_schedule(spec.optimizer)(state.step),
    }
    new_state = TrainState(
        step=state.step + 1, trainable=trainable, frozen=state.frozen, opt_state=opt_state, ema=ema
    )
    return new_state, metrics
