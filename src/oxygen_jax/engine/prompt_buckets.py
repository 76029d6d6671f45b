"""Prompt-length buckets: prefill the prompt columns a batch uses, not the tokenizer's padded width.

Prompts arrive padded to `max_token_len` columns (200 for pi0.5) for about 48 real tokens. A batch's
prompt arrays are cut on the host to the smallest bucket that holds its longest prompt (its last valid
column), prefilled, and the cache is padded back to the prompt's width inside the same program, so
everything downstream (denoise, insert, extension, the batch state) keeps the shapes it always had and
compiles nothing new. Prompt padding is masked and positions are cumsum(mask) - 1, so the valid columns
and everything read from them are the unbucketed ones; the padded-back columns are masked too.
"""

import jax.numpy as jnp
import numpy as np

from oxygen_jax.models import pi05


def default_buckets(max_token_len: int) -> tuple[int, ...]:
    """Powers of two from 32 below `max_token_len`, and `max_token_len` itself (200: 32, 64, 128, 200)."""
    powers = [1 << bit for bit in range(5, max_token_len.bit_length()) if 1 << bit < max_token_len]
    return (*powers, max_token_len)


def widths(columns: int, buckets: tuple[int, ...]) -> list[int]:
    """Every width a prompt of `columns` columns may be cut to: the buckets below it, and itself."""
    return sorted({b for b in buckets if b < columns} | {columns})


def width(prompt_mask: np.ndarray, buckets: tuple[int, ...]) -> int:
    """Prompt columns to prefill for a batch of prompt masks [B, L]: the smallest of `widths` that holds
    every row's last valid column."""
    valid = np.asarray(prompt_mask).any(axis=0)
    used = int(np.flatnonzero(valid)[-1]) + 1 if valid.any() else 1
    return min(w for w in widths(len(valid), buckets) if w >= used)


def filled_masks(shape: tuple[int, int], buckets: tuple[int, ...]) -> list[np.ndarray]:
    """Prompt masks [B, L] whose prompts fill each of `widths` in turn: warm-up inputs that compile every
    width a prefill may cut prompts of L columns to."""
    columns = np.arange(shape[1])
    return [np.broadcast_to(columns < w, shape).copy() for w in widths(shape[1], buckets)]


def cut(obs: pi05.Observation, columns: int) -> pi05.Observation:
    """The observation with its prompt arrays cut to their first `columns` columns."""
    return obs.replace(
        tokenized_prompt=obs.tokenized_prompt[:, :columns],
        tokenized_prompt_mask=obs.tokenized_prompt_mask[:, :columns],
    )


def pad_cache(cache: pi05.PrefixCache, columns: int) -> pi05.PrefixCache:
    """A cache of a cut prompt padded with `columns` masked trailing columns (jittable): positions repeat
    the last one, as cumsum(mask) - 1 gives over prompt padding."""
    if not columns:
        return cache

    def pad(x, axis):
        widths = [(0, 0)] * x.ndim
        widths[axis] = (0, columns)
        return jnp.pad(x, widths, mode="edge" if x is cache.positions else "constant")

    return cache.replace(
        k=pad(cache.k, 2), v=pad(cache.v, 2), mask=pad(cache.mask, 1), positions=pad(cache.positions, 1)
    )


def prefill(
    params: dict, config: pi05.Pi05Config, obs: pi05.Observation, skip_cameras: tuple[str, ...], pad: int
) -> pi05.PrefixCache:
    """`pi05.prefill` of a cut observation, its cache padded back by `pad` prompt columns."""
    return pad_cache(pi05.prefill(params, config, obs, skip_cameras), pad)
