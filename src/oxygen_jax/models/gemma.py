"""Two-expert Gemma: one attention over the tokens of every expert, per-expert weights.

pi0.5 runs the PaliGemma backbone (expert 0) on the prefix and the action expert (expert 1, adaRMS
conditioned on the flow-matching time) on the suffix. Param names and shapes are openpi's, so openpi
checkpoints load unchanged: expert 0's modules carry the plain name (`attn/q_einsum`), expert i > 0 the
suffix `_i` (`attn/q_einsum_1`).

Einsum axes:
  B batch, T query length, S key/value length, N query heads, K kv heads, G query heads per kv head,
  H head dim, D model width, F mlp width.

Instead of openpi's "concatenate the cache inside attention and return it", every call returns only the
new tokens' post-RoPE keys/values; callers decide where they go (a prefix cache, a slot of the decode
batch state, or nowhere for denoising). Attention runs over `[cache columns | new tokens]` as key blocks
through the `Kernels.attention` hook: `concat_attention` concatenates them into one buffer with one
softmax, as openpi does (`PlainKernels`, and the engine on GPU); `block_attention` never materializes the
concatenation: one softmax over both logit blocks, then one value product per block (the engine on CPU).

The action expert's adaRMS modulations depend only on the flow time: denoising computes them for all
steps before its loop (`adarms_modulations`, an `AdaRMS` per step) and the norms take them ready-made.

`Transformer` owns the layer stack in one of two param layouts (its `scan` switch):
- scan=True, openpi's layout: every layer weight stacked over depth (`layers/...` [depth, ...]) and the
  stack run by `nn.scan`. Checkpoints and the param tree openpi writes use it.
- scan=False, the engine's runtime layout: one tree per layer (`layers_0`, `layers_1`, ...) run as a
  Python loop, with the attention q and kv weights stored D-first ([D, N, H], [D, 2, K, H] instead of
  openpi's [N, D, H], [2, K, D, H]). A layer sliced out of a stacked weight inside a loop is copied
  before the dot reads it, and with D between the output dims XLA:CPU copies the q/kv weights
  transposed on every call; per layer and D-first, each projection is one matmul over the weight as
  stored, which halves what a decode step moves. With `fused_qkv` (the engine on one device) each
  expert's q and kv weights are one `qkv_einsum` [D, N + 2K, H] (q heads, then k, then v): one
  projection instead of two.
`runtime_layers` converts openpi's stacked layers to the runtime layout, `fused_layers` that to the fused
one.
"""

import dataclasses
import math
import re
from collections.abc import Sequence
from typing import Protocol

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp

from oxygen_jax.models import block_softmax

# Fill value openpi (and the Gemma reference) uses for masked attention logits.
MASKED_LOGIT = -2.3819763e38
_RMS_EPS = 1e-6


@dataclasses.dataclass(frozen=True)
class GemmaConfig:
    width: int
    depth: int
    mlp_dim: int
    num_heads: int
    num_kv_heads: int
    head_dim: int


def _name(base: str, expert: int) -> str:
    return base if expert == 0 else f"{base}_{expert}"


class Kernels(Protocol):
    """How the large dots run. The model is written against this hook; the engine passes a policy chosen
    for its backend (engine/kernels.py), and `PlainKernels` is the backend-neutral default."""

    # True: the flow loop (`pi05.integrate_flow`) fully unrolled, else a loop of compile-time length.
    unroll_loops: bool

    def matmul(self, x: jax.Array, w: jax.Array) -> jax.Array:
        """x [..., K] @ w [K, N]."""

    def gating(self, x: jax.Array, w: jax.Array) -> jax.Array:
        """x [..., D] against both of w [2, D, F] -> [2, ..., F]."""

    def tied_logits(self, hidden: jax.Array, table: jax.Array) -> jax.Array:
        """hidden [..., D] against the embedding table [V, D] -> float32 logits [..., V]."""

    def attention(
        self, q: jax.Array, k_blocks: Sequence[jax.Array], v_blocks: Sequence[jax.Array], mask: jax.Array
    ) -> jax.Array:
        """Softmax attention of q [B, T, N, H] (RoPE applied, scaled by H**-0.5) over the key/value blocks
        [B, S_i, K, H] taken as one sequence of columns, under mask [B, T, sum S_i] (False: the logit is
        `MASKED_LOGIT`, so a fully masked row averages every value) -> [B, T, N, H] in q's dtype."""


@dataclasses.dataclass(frozen=True)
class PlainKernels:
    """Each dot as one einsum, as openpi writes it."""

    unroll_loops: bool = False

    def matmul(self, x: jax.Array, w: jax.Array) -> jax.Array:
        return jnp.dot(x, w)

    def gating(self, x: jax.Array, w: jax.Array) -> jax.Array:
        return jnp.einsum("...D,CDF->C...F", x, w)

    def tied_logits(self, hidden: jax.Array, table: jax.Array) -> jax.Array:
        return jnp.einsum("...D,VD->...V", hidden, table, preferred_element_type=jnp.float32)

    def attention(
        self, q: jax.Array, k_blocks: Sequence[jax.Array], v_blocks: Sequence[jax.Array], mask: jax.Array
    ) -> jax.Array:
        return concat_attention(q, k_blocks, v_blocks, mask)


PLAIN_KERNELS = PlainKernels()


def concat_attention(
    q: jax.Array, k_blocks: Sequence[jax.Array], v_blocks: Sequence[jax.Array], mask: jax.Array
) -> jax.Array:
    """`Kernels.attention` as openpi computes it: the blocks concatenated into one K/V buffer, one float32
    softmax over it."""
    k, v = (
        blocks[0] if len(blocks) == 1 else jnp.concatenate(blocks, axis=1) for blocks in (k_blocks, v_blocks)
    )
    batch, length, heads, head_dim = q.shape
    q = q.reshape(batch, length, k.shape[2], heads // k.shape[2], head_dim)
    logits = jnp.einsum("BTKGH,BSKH->BKGTS", q, k, preferred_element_type=jnp.float32)
    probs = jax.nn.softmax(jnp.where(mask[:, None, None], logits, MASKED_LOGIT), axis=-1).astype(q.dtype)
    return jnp.einsum("BKGTS,BSKH->BTKGH", probs, v).reshape(batch, length, heads, head_dim)


def block_attention(
    q: jax.Array, k_blocks: Sequence[jax.Array], v_blocks: Sequence[jax.Array], mask: jax.Array
) -> jax.Array:
    """`Kernels.attention` over blocks never concatenated: one logit block per key block, one softmax over
    all of them (`block_softmax.attend`), one value product per block. Under a vjp (guided denoising) a
    concatenation turns into slices of the gradient and slices into pads; this has neither.

    Batch dims first ([B, K, G*T, H] queries against [B, K, S, H] keys): each dot is one matmul batched
    over (B, K) with every query row of a kv head together; with K == 1 the key/value transposes are free.
    """
    batch, length, heads, head_dim = q.shape
    kv_heads = k_blocks[0].shape[2]
    groups = heads // kv_heads
    q = q.reshape(batch, length, kv_heads, groups, head_dim).transpose(0, 2, 3, 1, 4)
    q = q.reshape(batch, kv_heads, groups * length, head_dim)
    logits, start, shape = [], 0, (batch, kv_heads, groups, length, -1)
    for k in k_blocks:
        block = jnp.einsum("BKMH,BKSH->BKMS", q, k.transpose(0, 2, 1, 3), preferred_element_type=jnp.float32)
        block_mask = mask[:, None, None, :, start : start + k.shape[1]]
        logits.append(jnp.where(block_mask, block.reshape(shape), MASKED_LOGIT).reshape(block.shape))
        start += k.shape[1]
    encoded = block_softmax.attend(logits, [v.transpose(0, 2, 1, 3) for v in v_blocks])
    encoded = encoded.reshape(batch, kv_heads, groups, length, head_dim).transpose(0, 3, 1, 2, 4)
    return encoded.reshape(batch, length, heads, head_dim)


class Projection(nn.Module):
    """A weight `w` [*in, *out] contracting x's trailing `in_dims` dims, run as one 2-D matmul that reads
    the weight as stored (an einsum contracting (N, H) of a [N, H, D] weight may copy it transposed)."""

    shape: tuple[int, ...]
    init_fn: nn.initializers.Initializer
    kernels: Kernels
    in_dims: int = 1

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        w = self.param("w", self.init_fn, self.shape).astype(x.dtype)
        fan_in = math.prod(self.shape[: self.in_dims])
        batch = x.shape[: x.ndim - self.in_dims]
        y = self.kernels.matmul(x.reshape(*batch, fan_in), w.reshape(fan_in, -1))
        return y.reshape(*batch, *self.shape[self.in_dims :])


@flax.struct.dataclass
class Modulated:
    """An adaRMS norm's (scale | shift | gate) [..., 3 * width], computed ahead of the norm from its
    condition (`adarms_modulations`)."""

    value: jax.Array


@flax.struct.dataclass
class AdaRMS:
    """One expert's adaRMS modulations for every norm of the runtime layout, computed ahead of the layers
    (`adarms_modulations`): attention[i] and ffw[i] are layer i's pre-attention and pre-MLP norms'."""

    attention: tuple[jax.Array, ...]
    ffw: tuple[jax.Array, ...]
    final: jax.Array

    def layer(self, i: int) -> tuple[Modulated, Modulated]:
        return Modulated(self.attention[i]), Modulated(self.ffw[i])


def adarms_modulations(llm: dict, cond: jax.Array, expert: int, dtype: str) -> AdaRMS:
    """Every adaRMS norm's modulation of `expert` from cond [..., D_cond], over the runtime layout's `llm`
    params: each norm's Dense applied once to all rows of cond (the flow steps' conditions, computed before
    the loop instead of in every step), as `RMSNorm` would apply it to one row at a time."""

    def modulate(norm: dict) -> jax.Array:
        dense = norm["Dense_0"]
        return nn.Dense(dense["kernel"].shape[-1], dtype=dtype).apply({"params": dense}, cond)

    layers = [llm[layer_name(i)] for i in range(sum(k.startswith("layers_") for k in llm))]
    return AdaRMS(
        attention=tuple(modulate(layer[_name("pre_attention_norm", expert)]) for layer in layers),
        ffw=tuple(modulate(layer[_name("pre_ffw_norm", expert)]) for layer in layers),
        final=modulate(llm[_name("final_norm", expert)]),
    )


class RMSNorm(nn.Module):
    """RMSNorm with zero-centred scale; adaRMS (scale, shift, gate from `cond`) when cond is given.

    cond: None, the condition [B, D_cond] (or [B, T, D_cond], one per token) from which the norm's Dense
    computes the modulation, or that modulation computed ahead (`Modulated`).
    Normalization, scale and shift are computed in float32 and cast back to the input dtype.
    Returns (normed, gate); gate is None for plain RMSNorm.

    openpi writes 1 / sqrt(var + eps), which XLA rewrites to rsqrt unless the sqrt is needed elsewhere, as
    it is under a vjp (guided denoising); rsqrt written out gives both programs the same rounding.
    """

    @nn.compact
    def __call__(
        self, x: jax.Array, cond: "jax.Array | Modulated | None"
    ) -> tuple[jax.Array, jax.Array | None]:
        dtype = x.dtype
        var = jnp.mean(jnp.square(x.astype(jnp.float32)), axis=-1, keepdims=True)
        normed = x * jax.lax.rsqrt(var + _RMS_EPS)
        if cond is None:
            scale = self.param("scale", nn.initializers.zeros_init(), (x.shape[-1],))
            return (normed * (1 + scale)).astype(dtype), None
        if isinstance(cond, Modulated):
            modulation = cond.value
        else:
            modulation = nn.Dense(x.shape[-1] * 3, kernel_init=nn.initializers.zeros, dtype=dtype)(cond)
        if modulation.ndim == 2:  # one condition per row, else one per token (or one for all rows)
            modulation = modulation[:, None, :]
        scale, shift, gate = jnp.split(modulation, 3, axis=-1)
        return (normed * (1 + scale) + shift).astype(dtype), gate


class FeedForward(nn.Module):
    """GeGLU: gelu(x W0) * (x W1) W2 with tanh-approximate gelu."""

    width: int
    mlp_dim: int
    kernels: Kernels

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        w_gating = self.param(
            "gating_einsum",
            nn.initializers.lecun_normal(in_axis=-2, out_axis=-1, batch_axis=(0,)),
            (2, self.width, self.mlp_dim),
        ).astype(x.dtype)
        gate, up = self.kernels.gating(x, w_gating)
        hidden = nn.gelu(gate) * up
        w_linear = self.param(
            "linear", nn.initializers.lecun_normal(in_axis=-2, out_axis=-1), (self.mlp_dim, self.width)
        ).astype(x.dtype)
        return self.kernels.matmul(hidden, w_linear)


def _split(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Veltkamp split of float32 x into two 12-bit halves whose pairwise products are exact."""
    c = x * 4097.0
    hi = c - (c - x)
    return hi, x - hi


def divide_correctly_rounded(a: jax.Array, b: jax.Array) -> jax.Array:
    """float32 a / b rounded as IEEE division rounds it.

    XLA:CPU lowers float32 division to a reciprocal-based sequence that can be 1 ulp off; at RoPE
    angles of several hundred radians that ulp moves keys by ~3e-5. One Newton correction with an
    exactly computed residual restores the IEEE quotient, so keys match openpi's reference bit-close.
    """
    q = a / b
    q_hi, q_lo = _split(q)
    b_hi, b_lo = _split(b)
    residual = ((q_hi * b_hi - a) + q_hi * b_lo + q_lo * b_hi) + q_lo * b_lo
    return q - residual / b


def apply_rope(x: jax.Array, positions: jax.Array, max_wavelength: float = 10_000.0) -> jax.Array:
    """Rotary embedding over split halves of H, computed in float32. x: [B, T, N, H], positions: [B, T]."""
    half = x.shape[-1] // 2
    timescale = max_wavelength ** ((2.0 / x.shape[-1]) * jnp.arange(half, dtype=jnp.float32))
    radians = divide_correctly_rounded(positions[..., None].astype(jnp.float32), timescale)[..., None, :]
    sin, cos = jnp.sin(radians), jnp.cos(radians)
    x1, x2 = x[..., :half], x[..., half:]
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


def write_columns(cache: jax.Array, new: jax.Array, start: jax.Array) -> jax.Array:
    """cache [B, S, K, H] with new [B, T, K, H] at columns start[b] + t (start >= S: row not written)."""
    rows = jnp.arange(cache.shape[0])[:, None]
    cols = start[:, None] + jnp.arange(new.shape[1])[None, :]
    return cache.at[rows, cols].set(new.astype(cache.dtype), mode="drop")


def _moved_init(init_fn: nn.initializers.Initializer, openpi_shape: tuple[int, ...], axis: int):
    """Draws as openpi does in its layout, then moves `axis` to the front (the runtime layout)."""

    def init(key, shape, dtype=jnp.float32):
        w = jnp.moveaxis(init_fn(key, openpi_shape, dtype), axis, 0)
        assert w.shape == tuple(shape), (w.shape, shape)
        return w

    return init


class Einsum(nn.Module):
    """A weight `w` of `shape` applied by one einsum, in the layout openpi stores it."""

    shape: tuple[int, ...]
    init_fn: nn.initializers.Initializer

    @nn.compact
    def __call__(self, eqn: str, x: jax.Array) -> jax.Array:
        return jnp.einsum(eqn, x, self.param("w", self.init_fn, self.shape).astype(x.dtype))


_Q_INIT = nn.initializers.lecun_normal(in_axis=-2, out_axis=-1, batch_axis=(0,))
_KV_INIT = nn.initializers.lecun_normal(in_axis=-2, out_axis=-1, batch_axis=(0, 1))


def fuse_qkv(q: jax.Array, kv: jax.Array) -> jax.Array:
    """Runtime-layout q [D, N, H] and kv [D, 2, K, H] -> the fused weight [D, N + 2K, H]: q, k, v."""
    return jnp.concatenate([q, kv.reshape(kv.shape[0], -1, kv.shape[-1])], axis=1)


def _fused_init(q_shape: tuple[int, ...], kv_shape: tuple[int, ...]):
    """q and kv drawn as openpi draws them (from two keys), fused D-first."""

    def init(key, shape, dtype=jnp.float32):
        q_key, kv_key = jax.random.split(key)
        q = _moved_init(_Q_INIT, q_shape, axis=1)(q_key, (q_shape[1], q_shape[0], q_shape[2]), dtype)
        kv_moved = (kv_shape[2], kv_shape[0], kv_shape[1], kv_shape[3])
        return fuse_qkv(q, _moved_init(_KV_INIT, kv_shape, axis=2)(kv_key, kv_moved, dtype))

    return init


class Attention(nn.Module):
    """Joint MQA over all experts' tokens.

    Without `write_idx`: attends `[cache | new tokens]` under mask [B, T, S_cache + T] and returns the
    new tokens' (k, v). With `write_idx` [B]: writes the new tokens into the cache at those columns
    first, attends the updated cache under mask [B, T, S_cache] and returns it. The write-then-read
    order lets XLA update a decode buffer in place; a read before the write would force a copy.
    With `query_rows` [B] (one expert's tokens only): keys/values for every token, but queries (and the
    output, [B, 1, D]) only for token query_rows[b] of each row.
    d_first: q/kv weights in the runtime layout (see the module docstring), else openpi's; fused_qkv (with
    d_first): one `qkv_einsum` weight [D, N + 2K, H] per expert, one projection for q, k and v.
    """

    configs: tuple[GemmaConfig, ...]
    kernels: Kernels
    d_first: bool
    fused_qkv: bool = False

    def _qkv(
        self, x: jax.Array, c: GemmaConfig, expert: int, query_rows: jax.Array | None
    ) -> tuple[jax.Array, jax.Array, jax.Array]:
        """x [B, T, D] -> q [B, T, N, H] (T = 1 with query_rows: see the class), k and v [B, T, K, H]."""
        q_name, kv_name = _name("q_einsum", expert), _name("kv_einsum", expert)
        q_shape, kv_shape = (c.num_heads, c.width, c.head_dim), (2, c.num_kv_heads, c.width, c.head_dim)
        if self.fused_qkv:  # q for every token, then the rows kept: one projection is the point
            qkv = Projection(
                (c.width, c.num_heads + 2 * c.num_kv_heads, c.head_dim),
                _fused_init(q_shape, kv_shape),
                self.kernels,
                name=_name("qkv_einsum", expert),
            )(x)
            q, k, v = jnp.split(qkv, [c.num_heads, c.num_heads + c.num_kv_heads], axis=2)
            return (q if query_rows is None else take_rows(q, query_rows)), k, v
        x_q = x if query_rows is None else take_rows(x, query_rows)
        if not self.d_first:
            q = Einsum(q_shape, _Q_INIT, name=q_name)("BTD,NDH->BTNH", x_q)
            k, v = Einsum(kv_shape, _KV_INIT, name=kv_name)("BTD,CKDH->CBTKH", x)
            return q, k, v
        q = Projection(
            (c.width, c.num_heads, c.head_dim),
            _moved_init(_Q_INIT, q_shape, axis=1),
            self.kernels,
            name=q_name,
        )(x_q)
        kv = Projection(
            (c.width, 2, c.num_kv_heads, c.head_dim),
            _moved_init(_KV_INIT, kv_shape, axis=2),
            self.kernels,
            name=kv_name,
        )(x)
        k, v = jnp.moveaxis(kv, 2, 0)
        return q, k, v

    @nn.compact
    def __call__(self, xs, positions, mask, kv_cache, write_idx=None, query_rows=None):
        cfg = self.configs[0]
        dtype = next(x.dtype for x in xs if x is not None)
        q_positions = positions
        if query_rows is not None:
            assert sum(x is not None for x in xs) == 1, "query_rows: one expert's tokens only"
            q_positions, mask = take_rows(positions, query_rows), take_rows(mask, query_rows)
        qs, ks, vs = [], [], []
        for i, (x, c) in enumerate(zip(xs, self.configs, strict=True)):
            if x is not None:
                q, k, v = self._qkv(x, c, i, query_rows)
                qs.append(q)
                ks.append(k)
                vs.append(v)
        q, k_new, v_new = (jnp.concatenate(t, axis=1) for t in (qs, ks, vs))

        q = apply_rope(q, q_positions) * cfg.head_dim**-0.5
        k_new = apply_rope(k_new, positions)
        if kv_cache is None:
            blocks = [(k_new, v_new)]
        elif write_idx is None:
            blocks = [tuple(c.astype(dtype) for c in kv_cache), (k_new, v_new)]
        else:
            k_new, v_new = (
                write_columns(c, n, write_idx) for c, n in zip(kv_cache, (k_new, v_new), strict=True)
            )
            blocks = [(k_new.astype(dtype), v_new.astype(dtype))]

        encoded = self.kernels.attention(q, [k for k, _ in blocks], [v for _, v in blocks], mask)

        out, start = [], 0
        for i, (x, c) in enumerate(zip(xs, self.configs, strict=True)):
            if x is None:
                out.append(None)
                continue
            o_proj = Projection(
                (c.num_heads, c.head_dim, c.width),
                nn.initializers.lecun_normal(in_axis=(-3, -2), out_axis=-1),
                self.kernels,
                in_dims=2,
                name=_name("attn_vec_einsum", i),
            )
            length = x.shape[1] if query_rows is None else 1
            out.append(o_proj(encoded[:, start : start + length]))
            start += length
        return out, (k_new, v_new)


def take_rows(x: jax.Array, rows: jax.Array) -> jax.Array:
    """x [B, T, ...] at token rows[b] of each row -> [B, 1, ...]."""
    return jnp.take_along_axis(x, rows.reshape(-1, *(1,) * (x.ndim - 1)), axis=1)


def _gated_residual(x, y, gate):
    if x is None:
        return None
    return x + y if gate is None else x + y * gate


def _norm_cond(cond, which: int):
    """A layer's adaRMS input for its norm `which` (0 pre-attention, 1 pre-MLP): see `Block`."""
    return cond[which] if isinstance(cond, tuple) else cond


class Block(nn.Module):
    """Pre-norm transformer layer shared by all experts (d_first, query_rows: see `Attention`; with
    query_rows the outputs are the queried rows'). adarms_cond per expert: None, the condition, or the
    (pre-attention, pre-MLP) norms' `Modulated` (`AdaRMS.layer`)."""

    configs: tuple[GemmaConfig, ...]
    kernels: Kernels
    d_first: bool
    fused_qkv: bool = False

    @nn.compact
    def __call__(self, xs, kv_cache, positions, mask, adarms_cond, write_idx, query_rows=None):
        normed, gates = [], []
        for i, (x, cond) in enumerate(zip(xs, adarms_cond, strict=True)):
            norm = RMSNorm(name=_name("pre_attention_norm", i))
            n, g = norm(x, _norm_cond(cond, 0)) if x is not None else (None, None)
            normed.append(n)
            gates.append(g)
        attn_out, new_kv = Attention(self.configs, self.kernels, self.d_first, self.fused_qkv, name="attn")(
            normed, positions, mask, kv_cache, write_idx, query_rows
        )
        if query_rows is not None:  # the residual stream goes on for the queried rows only
            assert not any(g is not None for g in gates), "query_rows: no adaRMS"
            xs = [None if x is None else take_rows(x, query_rows) for x in xs]
        xs = [_gated_residual(x, y, g) for x, y, g in zip(xs, attn_out, gates, strict=True)]

        ffn_out, gates = [], []
        for i, (x, cond, c) in enumerate(zip(xs, adarms_cond, self.configs, strict=True)):
            if x is None:
                ffn_out.append(None)
                gates.append(None)
                continue
            n, g = RMSNorm(name=_name("pre_ffw_norm", i))(x, _norm_cond(cond, 1))
            ffn_out.append(FeedForward(c.width, c.mlp_dim, self.kernels, name=_name("mlp", i))(n))
            gates.append(g)
        xs = [_gated_residual(x, y, g) for x, y, g in zip(xs, ffn_out, gates, strict=True)]
        return xs, new_kv


class Embedder(nn.Module):
    """The token embedding table, shared by the input embedding and the language head."""

    vocab_size: int
    width: int

    def setup(self):
        self.table = self.param("input_embedding", nn.initializers.normal(), (self.vocab_size, self.width))


def layer_name(i: int) -> str:
    """Layer i's param tree in the runtime layout (the unscanned `Transformer`)."""
    return f"layers_{i}"


def stack_layers(per_layer: jax.Array | Sequence[jax.Array]) -> jax.Array:
    """[depth, ...] from a per-layer sequence of arrays (or an array already stacked)."""
    return per_layer if isinstance(per_layer, jax.Array) else jnp.stack(per_layer)


class Transformer(nn.Module):
    """The expert-0 embedder (tied with the language head), the layer stack and every expert's final norm.

    scan: layers stacked over depth and run by `nn.scan` (openpi's param tree), else one param tree per
    layer (`layers_i`, q/kv D-first) run as a Python loop; see the module docstring.
    """

    configs: tuple[GemmaConfig, ...]
    vocab_size: int
    dtype: str
    kernels: Kernels
    scan: bool = True
    fused_qkv: bool = False

    def setup(self):
        self.embedder = Embedder(self.vocab_size, self.configs[0].width, name="embedder")
        depth = self.configs[0].depth
        if self.scan:
            self.layers = nn.scan(
                Block,
                variable_axes={"params": 0},
                split_rngs={"params": True},
                in_axes=(0, nn.broadcast, nn.broadcast, nn.broadcast, nn.broadcast),
                length=depth,
            )(self.configs, self.kernels, d_first=False)
        else:
            self.layers = [
                Block(self.configs, self.kernels, d_first=True, fused_qkv=self.fused_qkv, name=layer_name(i))
                for i in range(depth)
            ]
        self.final_norms = [RMSNorm(name=_name("final_norm", i)) for i in range(len(self.configs))]

    def __call__(
        self,
        embedded: Sequence[jax.Array | None],
        positions: jax.Array,
        mask: jax.Array,
        adarms_cond: Sequence[jax.Array | None] | None = None,
        kv_cache: tuple | None = None,
        write_idx: jax.Array | None = None,
        last_layer_rows: jax.Array | None = None,
    ) -> tuple[list[jax.Array | None], tuple]:
        """Every expert's tokens through the stack and its final norm.

        embedded: per expert [B, T_i, D_i] or None; positions [B, T]; mask [B, T, S_cache + T];
        adarms_cond: per expert None, the adaRMS condition, or (unscanned) its `AdaRMS` computed ahead;
        kv_cache: (k, v) of earlier columns, each indexable by layer to [B, S_cache, K, H] (a stacked
        [depth, ...] array or a per-layer sequence), or None; write_idx: see `Attention`.
        last_layer_rows [B] (one expert's tokens, no adaRMS): outputs only for token last_layer_rows[b] of
        each row ([B, 1, D]); unscanned, the last layer computes its attention and MLP for that token only
        (its keys/values for all).
        Returns (final-normed outputs per expert, (k, v)): per layer the new tokens' [B, T, K, H], or
        with write_idx the updated cache; a [depth, ...] array when scanned, else a per-layer tuple.
        """
        xs = [None if e is None else e.astype(self.dtype) for e in embedded]
        if adarms_cond is None:
            adarms_cond = [None] * len(self.configs)
        if self.scan:
            cache = None if kv_cache is None else tuple(stack_layers(c) for c in kv_cache)
            xs, new_kv = self.layers(xs, cache, positions, mask, adarms_cond, write_idx)
            if last_layer_rows is not None:
                xs = [None if x is None else take_rows(x, last_layer_rows) for x in xs]
        else:
            per_layer = []
            for i, layer in enumerate(self.layers):
                layer_cache = None if kv_cache is None else (kv_cache[0][i], kv_cache[1][i])
                layer_cond = [c.layer(i) if isinstance(c, AdaRMS) else c for c in adarms_cond]
                rows = last_layer_rows if i == len(self.layers) - 1 else None
                xs, kv = layer(xs, layer_cache, positions, mask, layer_cond, write_idx, rows)
                per_layer.append(kv)
            new_kv = tuple(zip(*per_layer, strict=True))
        normed = [
            None if x is None else norm(x, Modulated(cond.final) if isinstance(cond, AdaRMS) else cond)[0]
            for norm, x, cond in zip(self.final_norms, xs, adarms_cond, strict=True)
        ]
        return normed, new_kv

    def embed(self, tokens: jax.Array) -> jax.Array:
        """Token ids [B, T] -> [B, T, D] scaled by sqrt(D) in the table dtype, then cast (as openpi)."""
        x = self.embedder.table[(tokens,)]
        return (x * jnp.sqrt(self.configs[0].width).astype(x.dtype)).astype(self.dtype)

    def logits(self, hidden: jax.Array) -> jax.Array:
        """Tied language head: final-normed hidden [..., D] -> float32 logits [..., vocab]."""
        return self.kernels.tied_logits(hidden, self.embedder.table.astype(hidden.dtype))


# Runtime layout of the attention weights: which openpi axis (D) moves to the front.
_D_AXIS = {"q_einsum": 1, "kv_einsum": 2}


def _d_axis(path) -> int | None:
    """The openpi axis of D if `path` is an attention q/kv weight (of any expert), else None."""
    *_, module, leaf = (k.key for k in path)
    return _D_AXIS.get(re.sub(r"_\d+$", "", module)) if leaf == "w" else None


def runtime_layers(layers: dict) -> dict[str, dict]:
    """openpi's stacked layer params (`layers`) -> per-layer trees `layers_i` in the runtime layout."""

    def layer(i):
        def convert(path, x):
            axis = _d_axis(path)
            return x[i] if axis is None else jnp.moveaxis(x[i], axis, 0)

        return jax.tree_util.tree_map_with_path(convert, layers)

    return {layer_name(i): layer(i) for i in range(jax.tree.leaves(layers)[0].shape[0])}


def fused_layers(llm: dict) -> dict:
    """The runtime layout's per-layer trees in `llm` with each expert's q and kv weights fused into one
    `qkv_einsum` (`fuse_qkv`), the layout `Transformer(fused_qkv=True)` runs; other entries as they are."""

    def fuse(attn: dict) -> dict:
        fused = {}
        for name, value in attn.items():
            base = re.sub(r"_\d+$", "", name)
            suffix = name[len(base) :]
            if base == "q_einsum":
                fused[f"qkv_einsum{suffix}"] = {"w": fuse_qkv(value["w"], attn[f"kv_einsum{suffix}"]["w"])}
            elif base != "kv_einsum":
                fused[name] = value
        return fused

    return {
        k: {**v, "attn": fuse(v["attn"])} if re.fullmatch(r"layers_\d+", k) else v for k, v in llm.items()
    }
