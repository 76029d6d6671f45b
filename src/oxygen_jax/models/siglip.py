"""SigLIP ViT image encoder (no pooling), producing one token per patch in the LLM width.

Names follow big_vision/openpi (`embedding`, `pos_embedding`, `Transformer/encoderblock`,
`Transformer/encoder_norm`, `head`) so PaliGemma weights load unchanged. The patch stem and the
position embedding run in float32; the encoder runs in the compute dtype.

`Encoder` owns the layer stack in one of two param layouts (its `scan` switch), as `gemma.Transformer`
owns the language model's:
- scan=True, openpi's layout: every layer weight stacked over depth (`encoderblock/...` [depth, ...]),
  the stack run by `nn.scan`, attention as Flax's `MultiHeadDotProductAttention` with separate
  `query`, `key` and `value` kernels [D, N, H]. Checkpoints and the param tree openpi writes use it.
- scan=False, the engine's runtime layout: one tree per layer (`encoderblock_0`, `encoderblock_1`, ...)
  run as a Python loop, with the three input projections fused into one `qkv` kernel [D, 3, N, H]
  (bias [3, N, H]). The program has no loop: XLA sees every layer (a scanned layer's weights are sliced
  out of the stack inside a while loop, one layer at a time), and each layer's input projection is one
  matmul three times as wide.
`runtime_encoder` converts openpi's stacked encoder to the runtime layout. Both compute the same
numbers: the fused projection computes the same dot products, and attention and the output projection
are Flax's own.
"""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np


@dataclasses.dataclass(frozen=True)
class SiglipConfig:
    width: int
    depth: int
    mlp_dim: int
    num_heads: int
    patch_size: int = 14


# Width, depth, mlp width and heads of the big_vision ViT variants ("<name>/<patch>").
_VARIANTS = {
    "mu": (32, 1, 128, 2),
    "Ti": (192, 12, 768, 3),
    "S": (384, 12, 1536, 6),
    "M": (512, 12, 2048, 8),
    "B": (768, 12, 3072, 12),
    "L": (1024, 24, 4096, 16),
    "So400m": (1152, 27, 4304, 16),
}

# Flax's name for the attention module of a block; the runtime layout keeps it.
_ATTENTION = "MultiHeadDotProductAttention_0"
_QKV = ("query", "key", "value")


def siglip_variant(name: str) -> SiglipConfig:
    """'So400m/14' -> SiglipConfig."""
    size, _, patch = name.partition("/")
    if size not in _VARIANTS:
        raise ValueError(f"unknown SigLIP variant {name!r}; known sizes: {sorted(_VARIANTS)}")
    return SiglipConfig(*_VARIANTS[size], patch_size=int(patch or 14))


def block_name(i: int) -> str:
    """Layer i's param tree in the runtime layout (the unscanned `Encoder`)."""
    return f"encoderblock_{i}"


class MlpBlock(nn.Module):
    mlp_dim: int
    dtype: str

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        inits = {"kernel_init": nn.initializers.xavier_uniform(), "bias_init": nn.initializers.normal(1e-6)}
        width = x.shape[-1]
        x = nn.gelu(nn.Dense(self.mlp_dim, dtype=self.dtype, **inits)(x))
        return nn.Dense(width, dtype=self.dtype, **inits)(x)


def _fused_qkv_init(key: jax.Array, shape: tuple[int, int], dtype=jnp.float32) -> jax.Array:
    """Three xavier-uniform [D, N * H] draws, one per projection as Flax's attention draws them, side by
    side in the flat [D, 3 * N * H] shape `nn.DenseGeneral` asks its initializer for."""
    fan_in, fan_out = shape
    init = nn.initializers.xavier_uniform()
    draws = [init(k, (fan_in, fan_out // 3), dtype) for k in jax.random.split(key, 3)]
    return jnp.stack(draws, axis=1).reshape(shape)


class FusedSelfAttention(nn.Module):
    """`nn.MultiHeadDotProductAttention` as SigLIP calls it (self-attention, no mask, no dropout), its
    query/key/value kernels stored as one `qkv` kernel [D, 3, N, H] and applied by one matmul."""

    num_heads: int
    dtype: str

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        width = x.shape[-1]
        features = (3, self.num_heads, width // self.num_heads)
        qkv = nn.DenseGeneral(features, kernel_init=_fused_qkv_init, dtype=self.dtype, name="qkv")(x)
        q, k, v = (qkv[..., i, :, :] for i in range(3))
        y = nn.dot_product_attention(q, k, v, deterministic=True, dtype=self.dtype)
        return nn.DenseGeneral(
            width, axis=(-2, -1), kernel_init=nn.initializers.xavier_uniform(), dtype=self.dtype, name="out"
        )(y)


class EncoderBlock(nn.Module):
    """Pre-LN block: x + MHA(LN(x)); x + MLP(LN(x)). fused_qkv: attention in the runtime layout."""

    mlp_dim: int
    num_heads: int
    dtype: str
    fused_qkv: bool = False

    @nn.compact
    def __call__(self, x: jax.Array, _) -> tuple[jax.Array, None]:
        y = nn.LayerNorm(dtype=self.dtype)(x)
        if self.fused_qkv:
            y = FusedSelfAttention(self.num_heads, self.dtype, name=_ATTENTION)(y)
        else:
            y = nn.MultiHeadDotProductAttention(
                num_heads=self.num_heads, kernel_init=nn.initializers.xavier_uniform(), dtype=self.dtype
            )(y, y)
        x = x + y
        y = nn.LayerNorm(dtype=self.dtype)(x)
        return x + MlpBlock(self.mlp_dim, self.dtype)(y), None


class Encoder(nn.Module):
    """The layer stack and its final norm. scan: openpi's stacked layout, else the runtime layout (see
    the module docstring)."""

    config: SiglipConfig
    dtype: str
    scan: bool = True

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        c = self.config
        if self.scan:
            x, _ = nn.scan(
                EncoderBlock,
                variable_axes={"params": 0},
                split_rngs={"params": True},
                length=c.depth,
            )(c.mlp_dim, c.num_heads, self.dtype, name="encoderblock")(x, None)
        else:
            for i in range(c.depth):
                x, _ = EncoderBlock(c.mlp_dim, c.num_heads, self.dtype, fused_qkv=True, name=block_name(i))(
                    x, None
                )
        return nn.LayerNorm(name="encoder_norm", dtype=self.dtype)(x)


class Siglip(nn.Module):
    """Images [B, H, W, 3] in [-1, 1] -> tokens [B, (H/p)*(W/p), out_width]. scan: see `Encoder`."""

    config: SiglipConfig
    out_width: int
    dtype: str
    scan: bool = True

    @nn.compact
    def __call__(self, images: jax.Array) -> jax.Array:
        p = self.config.patch_size
        x = nn.Conv(
            self.config.width, (p, p), strides=(p, p), padding="VALID", name="embedding", dtype=jnp.float32
        )(jnp.asarray(images, jnp.float32))
        b, h, w, c = x.shape
        x = x.reshape(b, h * w, c)
        pos = self.param("pos_embedding", nn.initializers.normal(1 / np.sqrt(c)), (1, h * w, c), jnp.float32)
        x = (x + pos).astype(self.dtype)
        x = Encoder(self.config, self.dtype, self.scan, name="Transformer")(x)
        return nn.Dense(self.out_width, dtype=self.dtype, kernel_init=nn.initializers.zeros, name="head")(x)


def _fuse_attention(attention: dict) -> dict:
    """A block's `query`/`key`/`value` kernels [D, N, H] and biases [N, H] -> one `qkv` kernel
    [D, 3, N, H] and bias [3, N, H]."""
    return {
        "qkv": {
            "kernel": jnp.stack([attention[p]["kernel"] for p in _QKV], axis=1),
            "bias": jnp.stack([attention[p]["bias"] for p in _QKV], axis=0),
        },
        "out": attention["out"],
    }


def runtime_encoder(encoder: dict) -> dict:
    """openpi's `Transformer` params (layers stacked in `encoderblock`) -> the runtime layout: per-layer
    trees `encoderblock_i` with query/key/value fused. A tree already in that layout passes through."""
    if "encoderblock" not in encoder:
        return encoder
    stacked = encoder["encoderblock"]

    def block(i: int) -> dict:
        layer = jax.tree.map(lambda x: x[i], stacked)
        return layer | {_ATTENTION: _fuse_attention(layer[_ATTENTION])}

    depth = jax.tree.leaves(stacked)[0].shape[0]
    rest = {k: v for k, v in encoder.items() if k != "encoderblock"}
    return rest | {block_name(i): block(i) for i in range(depth)}
