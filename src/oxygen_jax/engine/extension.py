"""Prefix extension: several language tasks on one observation from one prefill.

A task's instruction is a short token suffix appended to an observation's prefix cache. Each suffix
attends to every valid prefix column and causally to itself (as generated tokens do), so the extended
row equals a single prefill of [images, prompt, suffix] with a causal suffix, in either prefix-attention
mode, without recomputing the images or the prompt. One call extends any number of tasks over any
prefix rows; the extended rows go into the batch state like any other prefix.
"""

import jax
import jax.numpy as jnp

from oxygen_jax.engine import batch_state
from oxygen_jax.models import gemma, pi05


def extend(
    params: dict,
    config: pi05.Pi05Config,
    cache: pi05.PrefixCache,
    rows: jax.Array,
    suffix: jax.Array,
    suffix_mask: jax.Array,
) -> pi05.PrefixCache:
    """Task t appends suffix[t] (left-aligned, suffix_mask[t] valid, at least one token) to prefix row
    rows[t]. Returns a cache of T rows and P + L columns: the prefix columns, then the suffix's.

    cache: B rows of P columns; rows: [T] int; suffix, suffix_mask: [T, L]. The next RoPE position is
    the prefix length plus the suffix length; the first generated token comes from the last valid
    suffix token's hidden state.
    """
    prefix = batch_state.select_rows(cache, rows)
    suffix_mask = suffix_mask.astype(bool)
    positions = prefix.length[:, None] + jnp.cumsum(suffix_mask, axis=1) - 1
    hidden, (k, v) = pi05.text_forward(params, config, suffix, positions, (prefix.k, prefix.v), prefix.mask)
    last = jnp.take_along_axis(hidden, (suffix_mask.sum(axis=1) - 1)[:, None, None], axis=1)[:, 0]
    k = gemma.stack_layers(k).astype(prefix.k.dtype)
    v = gemma.stack_layers(v).astype(prefix.v.dtype)
    return pi05.PrefixCache(
        k=jnp.concatenate([prefix.k, k], axis=2),
        v=jnp.concatenate([prefix.v, v], axis=2),
        mask=jnp.concatenate([prefix.mask, suffix_mask], axis=1),
        positions=jnp.concatenate([prefix.positions, positions], axis=1),
        length=prefix.length + suffix_mask.sum(axis=1),
        last_hidden=last.astype(prefix.last_hidden.dtype),
    )
