"""SigLIP ViT image encoder (no pooling), producing one token per patch in the LLM width.

Names follow big_vision/openpi (`embedding`, `pos_embedding`, `Transformer/encoderblock`,
`Transformer/encoder_norm`, `head`) so PaliGemma weights load unchanged. The patch stem and the
position embedding run in float32; the encoder runs in the compute dtype.
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


def siglip_variant(name: str) -> SiglipConfig:
    """'So400m/14' -> SiglipConfig."""
    size, _, patch = name.partition("/")
    if size not in _VARIANTS:
        raise ValueError(f"unknown SigLIP variant {name!r}; known sizes: {sorted(_VARIANTS)}")
    return SiglipConfig(*_VARIANTS[size], patch_size=int(patch or 14))


class MlpBlock(nn.Module):
    mlp_dim: int
    dtype: str

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        inits = {"kernel_init": nn.initializers.xavier_uniform(), "bias_init": nn.initializers.normal(1e-6)}
        width = x.shape[-1]
        x = nn.gelu(nn.Dense(self.mlp_dim, dtype=self.dtype, **inits)(x))
        return nn.Dense(width, dtype=self.dtype, **inits)(x)


class EncoderBlock(nn.Module):
    """Pre-LN block: x + MHA(LN(x)); x + MLP(LN(x)). Scanned over depth."""

    mlp_dim: int
    num_heads: int
    dtype: str

    @nn.compact
    def __call__(self, x: jax.Array, _) -> tuple[jax.Array, None]:
        y = nn.LayerNorm(dtype=self.dtype)(x)
        y = nn.MultiHeadDotProductAttention(
            num_heads=self.num_heads, kernel_init=nn.initializers.xavier_uniform(), dtype=self.dtype
        )(y, y)
        x = x + y
        y = nn.LayerNorm(dtype=self.dtype)(x)
        return x + MlpBlock(self.mlp_dim, self.dtype)(y), None


class Encoder(nn.Module):
    config: SiglipConfig
    dtype: str

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x, _ = nn.scan(
            EncoderBlock,
            variable_axes={"params": 0},
            split_rngs={"params": True},
            length=self.config.depth,
        )(self.config.mlp_dim, self.config.num_heads, self.dtype, name="encoderblock")(x, None)
        return nn.LayerNorm(name="encoder_norm", dtype=self.dtype)(x)


class Siglip(nn.Module):
    """Images [B, H, W, 3] in [-1, 1] -> tokens [B, (H/p)*(W/p), out_width]."""

    config: SiglipConfig
    out_width: int
    dtype: str

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
        x = Encoder(self.config, self.dtype, name="Transformer")(x)
        return nn.Dense(self.out_width, dtype=self.dtype, kernel_init=nn.initializers.zeros, name="head")(x)
