"""openpi's optimizer recipe through optax: global-norm clip, AdamW, warmup-cosine learning rate.

    tx = create_optimizer(OptimizerConfig(peak_lr=5e-5, warmup_steps=10, decay_steps=100))

is `optax.chain(clip_by_global_norm(1.0), adamw(schedule, b1=0.9, b2=0.95, eps=1e-8,
weight_decay=1e-10))` with openpi's `CosineDecaySchedule`: linear warmup from peak/(warmup+1) to peak,
then cosine decay to `decay_lr` at `decay_steps`. Weight decay is 1e-10 rather than 0 as in openpi
(its comment: 0 can run out of memory). The EMA of the params lives in the train state (train_step.py).
"""

import dataclasses

import ml_collections
import optax


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
    """Defaults are openpi's `AdamW()` and `CosineDecaySchedule()`."""

    peak_lr: float = 2.5e-5
    warmup_steps: int = 1_000
    decay_steps: int = 30_000
    decay_lr: float = 2.5e-6
    b1: float = 0.9
    b2: float = 0.95
    eps: float = 1e-8
    weight_decay: float = 1e-10
    clip_gradient_norm: float = 1.0

    @classmethod
    def from_training(cls, training: ml_collections.ConfigDict) -> "OptimizerConfig":
        """The fields of the same names in a config's `training` section."""
        return cls(**{f.name: training[f.name] for f in dataclasses.fields(cls)})


def lr_schedule(config: OptimizerConfig) -> optax.Schedule:
    return optax.warmup_cosine_decay_schedule(
        init_value=config.peak_lr / (config.warmup_steps + 1),
        peak_value=config.peak_lr,
        warmup_steps=config.warmup_steps,
        decay_steps=config.decay_steps,
        end_value=config.decay_lr,
    )


def create_optimizer(config: OptimizerConfig) -> optax.GradientTransformation:
    adamw = optax.adamw(
        lr_schedule(config),
        b1=config.b1,
        b2=config.b2,
        eps=config.eps,
        weight_decay=config.weight_decay,
    )
    return optax.chain(optax.clip_by_global_norm(config.clip_gradient_norm), adamw)
