"""pi0.5 training loss: subtask text cross-entropy + flow-matching MSE, as the OxyGen fork defines it.

    terms = compute_loss(params, config, batch, rng, LossConfig(text_loss_weight=1.0))
    terms.loss  # [B] = text_loss_weight * loss_ce + action_loss_weight * loss_flow
    (loss, terms), grads = jax.value_and_grad(mean_loss, has_aux=True)(params, config, batch, rng)

- loss_ce [B]: next-token cross-entropy of the prompt. The prefix pass's final-normed hidden state at
  text position i predicts token i + 1 through the tied embedding; the per-token log-probs are averaged
  over the tokens where `token_loss_mask[:, 1:]` is True (0 for a row with none). It needs a prefix
  that is causal over text (`prefix_attention="causal_text"`): a bidirectional prefix lets every token
  see the one it predicts, so that combination is refused.
- loss_flow [B]: time t ~ Beta(1.5, 1) * 0.999 + 0.001, x_t = t * noise + (1 - t) * actions, target
  u = noise - actions; mean over the horizon and the first `real_action_dim` dims of (v_t - u)^2, with
  v_t from the action expert against the same prefix cache.
- `text_loss_weight=0` with a bidirectional prefix and all action dims is openpi's actions-only pi0.5
  loss (its per-step mean over the batch is what openpi differentiates); loss_ce is then 0 and the
  text logits are never computed.

Noise and time come from `batch.noise`/`batch.time` when given, else from `rng` exactly as the OxyGen
fork draws them (so one key gives the same draw as upstream). Everything is a pure function of
(params, batch, rng): jit it with `config` and `loss_config` static.

A model with `max_clean_prefix` = m > 0 learns to continue a chunk whose start is given (real-time
chunking by conditioning, docs/rtc.md): each example draws d uniformly from 0..m (from its own stream of
`rng`, so noise and time are drawn as above); its first d action tokens get the clean actions at time 0,
and loss_flow averages over the other tokens only. A batch's `min_clean_prefix` [B] raises each example's
least d (capped at m): a chunk whose first actions are a stale chunk's, executed while the robot waited,
teaches how to continue them and never how to take them.
"""

import dataclasses

import flax.struct
import jax
import jax.numpy as jnp

from oxygen_jax.models import pi05
from oxygen_jax.training.batch import TrainBatch

_CLEAN_PREFIX_STREAM = 1  # fold_in index of the clean-prefix draw


@dataclasses.dataclass(frozen=True)
class LossConfig:
    """Static loss settings (hashable). real_action_dim None: every one of the model's action dims."""

    text_loss_weight: float = 1.0
    action_loss_weight: float = 1.0
    real_action_dim: int | None = None


@flax.struct.dataclass
class LossTerms:
    """Per-example terms [B] and the intermediates the parity tests compare (x_t, token_logprob)."""

    loss: jax.Array
    loss_flow: jax.Array
    loss_ce: jax.Array
    x_t: jax.Array
    # [B, L-1]: log p(tokenized_prompt[:, i+1]) at every position; None when the text loss is off.
    token_logprob: jax.Array | None


def sample_noise_and_time(rng: jax.Array, action_shape: tuple[int, ...]) -> tuple[jax.Array, jax.Array]:
    """OxyGen/openpi's draw: the key splits into (preprocess, noise, time); noise ~ N(0, 1) of the action
    shape, time ~ Beta(1.5, 1) per example, scaled to [0.001, 1]."""
    _, noise_rng, time_rng = jax.random.split(rng, 3)
    noise = jax.random.normal(noise_rng, action_shape)
    time = jax.random.beta(time_rng, 1.5, 1, action_shape[:-2]) * 0.999 + 0.001
    return noise, time


def sample_clean_prefix(
    rng: jax.Array, batch: int, horizon: int, max_clean_prefix: int, minimum: jax.Array | None = None
) -> jax.Array:
    """[B, H] bool: the first d ~ U{minimum..max_clean_prefix} tokens of each row (minimum [B], default 0,
    capped at max_clean_prefix; a stream of `rng` apart from the noise and time draws)."""
    low = 0 if minimum is None else jnp.clip(minimum, 0, max_clean_prefix)
    delay = jax.random.randint(
        jax.random.fold_in(rng, _CLEAN_PREFIX_STREAM), (batch,), low, max_clean_prefix + 1
    )
    return jnp.arange(horizon)[None, :] < delay[:, None]


def _text_cross_entropy(
    params: dict, config: pi05.Pi05Config, batch: TrainBatch, hidden: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """(ce [B], token_logprob [B, L-1]) from the prefix's final-normed hidden states [B, P, D]."""
    prompt = batch.observation.tokenized_prompt
    length, total = prompt.shape[1], hidden.shape[1]
    text_hidden = hidden[:, total - length : total - 1]
    logp = jax.nn.log_softmax(pi05.text_logits(params, config, text_hidden), axis=-1)
    token_logprob = jnp.take_along_axis(logp, prompt[:, 1:, None], axis=-1)[..., 0]
    mask = batch.token_loss_mask[:, 1:]
    ce = -jnp.sum(token_logprob * mask, axis=-1) / jnp.maximum(jnp.sum(mask, axis=-1), 1)
    return ce, token_logprob


def compute_loss(
    params: dict,
    config: pi05.Pi05Config,
    batch: TrainBatch,
    rng: jax.Array | None,
    loss_config: LossConfig = LossConfig(),
) -> LossTerms:
    """Per-example loss terms of one batch (see the module docstring)."""
    if loss_config.text_loss_weight and config.prefix_attention != "causal_text":
        raise ValueError(
            "the text loss needs model.prefix_attention='causal_text' (a bidirectional prefix shows every"
            " prompt token the token it predicts); set it or use text_loss_weight=0"
        )
    if batch.noise is None:
        if rng is None:
            raise ValueError("compute_loss needs an rng when the batch carries no noise and time")
        noise, time = sample_noise_and_time(rng, batch.actions.shape)
    else:
        noise, time = batch.noise, batch.time

    cache, hidden = pi05.prefix_forward(params, config, batch.observation)
    if loss_config.text_loss_weight:
        ce, token_logprob = _text_cross_entropy(params, config, batch, hidden)
    else:  # actions only: no [B, L, vocab] logits
        ce, token_logprob = jnp.zeros(batch.size, jnp.float32), None

    t = time[:, None, None]
    x_t = t * noise + (1 - t) * batch.actions
    u_t = noise - batch.actions
    dims = loss_config.real_action_dim or config.action_dim
    if config.max_clean_prefix:
        if rng is None:
            raise ValueError("compute_loss needs an rng to draw the clean prefix of max_clean_prefix > 0")
        clean = sample_clean_prefix(
            rng, batch.size, config.action_horizon, config.max_clean_prefix, batch.min_clean_prefix
        )
        x_t = jnp.where(clean[..., None], batch.actions, x_t)
        v_t = pi05.predict_velocity(params, config, cache, x_t, jnp.where(clean, 0.0, time[:, None]))
        token_error = jnp.mean(jnp.square(v_t[..., :dims] - u_t[..., :dims]).astype(jnp.float32), axis=-1)
        free = (~clean).astype(jnp.float32)
        flow = jnp.sum(token_error * free, axis=1) / jnp.sum(free, axis=1)
    else:
        v_t = pi05.predict_velocity(params, config, cache, x_t, time)
        flow = jnp.mean(jnp.square(v_t[..., :dims] - u_t[..., :dims]).astype(jnp.float32), axis=(1, 2))

    loss = loss_config.text_loss_weight * ce + loss_config.action_loss_weight * flow
    return LossTerms(loss=loss, loss_flow=flow, loss_ce=ce, x_t=x_t, token_logprob=token_logprob)


def mean_loss(
    params: dict,
    config: pi05.Pi05Config,
    batch: TrainBatch,
    rng: jax.Array | None,
    loss_config: LossConfig = LossConfig(),
) -> tuple[jax.Array, LossTerms]:
    """(batch mean of the per-example loss, the terms): what a train step differentiates."""
    terms = compute_loss(params, config, batch, rng, loss_config)
    return jnp.mean(terms.loss), terms
