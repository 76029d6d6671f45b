"""Language from a prefix cache: free-running generation (through the batch state) and scoring."""

import flax.struct
import jax
import jax.numpy as jnp

from oxygen_jax.engine import batch_state, sampling
from oxygen_jax.models import pi05


@flax.struct.dataclass
class TextOutput:
    """tokens [B, N] (0 after EOS), logprobs [B, N] (temperature-1 log-probability, 0 after EOS),
    lengths [B] (tokens emitted, EOS included)."""

    tokens: jax.Array
    logprobs: jax.Array
    lengths: jax.Array


def generate(
    params: dict,
    config: pi05.Pi05Config,
    cache: pi05.PrefixCache,
    max_new_tokens: int,
    max_new: jax.Array,
    temperature: jax.Array,
    top_p: jax.Array,
    seeds: jax.Array,
    eos_id: int = 1,
    *,
    mode: sampling.SamplingMode,
) -> TextOutput:
    """Decodes every prefix row to completion: a batch state of B slots, filled and run N steps.

    This is the same insert + decode the continuous-batching scheduler uses, so text generated alone
    and text generated in a shared batch come from one implementation. mode: the sampling paths the
    rows need (static, `SamplingMode.of` their temperatures and top-p).
    """
    batch = cache.mask.shape[0]
    state = batch_state.init_state(config, batch, max_new_tokens, cache.mask.shape[1])
    state = batch_state.insert(state, cache, jnp.arange(batch), max_new, temperature, top_p, seeds)
    state = batch_state.decode(params, config, state, max_new_tokens, eos_id, mode=mode)
    return TextOutput(tokens=state.tokens, logprobs=state.logprobs, lengths=state.n_generated)


def score(params: dict, config: pi05.Pi05Config, cache: pi05.PrefixCache, tokens: jax.Array) -> jax.Array:
    """Teacher forcing: log p(tokens[:, i] | prefix, tokens[:, :i]) for tokens [B, N] -> [B, N]."""
    positions = cache.length[:, None] + jnp.arange(tokens.shape[1])[None, :]
    hidden, _ = pi05.text_forward(
        params, config, tokens[:, :-1], positions[:, :-1], (cache.k, cache.v), cache.mask
    )
    hidden = jnp.concatenate([cache.last_hidden[:, None].astype(hidden.dtype), hidden], axis=1)
    logprobs = jax.nn.log_softmax(pi05.text_logits(params, config, hidden), axis=-1)
    return jnp.take_along_axis(logprobs, tokens[..., None], axis=-1)[..., 0]
