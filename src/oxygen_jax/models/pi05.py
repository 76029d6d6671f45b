"""pi0.5: SigLIP + two-expert Gemma with flow-matching actions, as pure functions over `params`.

The prefix (camera tokens + prompt tokens) runs once through the PaliGemma expert and leaves a
`PrefixCache`; the action expert denoises against it without ever writing it, and language decoding
(engine/) reads the same cache. Param tree and numerics are openpi's `Pi0(pi05=True)`.
"""

import dataclasses
import functools

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp

from oxygen_jax.models import gemma, siglip


@dataclasses.dataclass(frozen=True)
class Pi05Config:
    """Static model description (hashable: passed to jitted functions as a static argument)."""

    paligemma: gemma.GemmaConfig
    action_expert: gemma.GemmaConfig
    vision: siglip.SiglipConfig
    vocab_size: int
    action_dim: int
    action_horizon: int
    max_token_len: int
    image_keys: tuple[str, ...]
    image_size: int
    dtype: str
    prefix_attention: str = "bidirectional"
    # How the large dots run; the engine sets the policy of its backend (engine/kernels.py).
    kernels: gemma.Kernels = gemma.PLAIN_KERNELS

    def __post_init__(self):
        if self.prefix_attention not in ("bidirectional", "causal_text"):
            raise ValueError(
                f"prefix_attention must be 'bidirectional' or 'causal_text', got {self.prefix_attention!r}"
            )

    @property
    def image_tokens(self) -> int:
        return (self.image_size // self.vision.patch_size) ** 2

    @property
    def prefix_len(self) -> int:
        return len(self.image_keys) * self.image_tokens + self.max_token_len


@flax.struct.dataclass
class Observation:
    """Model-level inputs: images [B, H, W, 3] float in [-1, 1], masks [B], prompt [B, L]."""

    images: dict[str, jax.Array]
    image_masks: dict[str, jax.Array]
    tokenized_prompt: jax.Array
    tokenized_prompt_mask: jax.Array


@flax.struct.dataclass
class PrefixCache:
    """What one prefill leaves behind, shared by action denoising and language decoding.

    k, v: [depth, B, P, K, H] post-RoPE keys/values; mask: [B, P] valid columns (masked cameras and
    prompt padding are False); positions: [B, P]; length: [B] = number of valid columns (the next
    RoPE position); last_hidden: [B, D] final-normed hidden state of the last valid column, from
    which the first language token is predicted.
    """

    k: jax.Array
    v: jax.Array
    mask: jax.Array
    positions: jax.Array
    length: jax.Array
    last_hidden: jax.Array


def _llm(config: Pi05Config) -> gemma.Gemma:
    return gemma.Gemma(
        (config.paligemma, config.action_expert), config.vocab_size, config.dtype, config.kernels
    )


def _vision(config: Pi05Config) -> siglip.Siglip:
    return siglip.Siglip(config.vision, config.paligemma.width, config.dtype)


def _dense(features: int) -> nn.Dense:
    return nn.Dense(features)


def _dummy_llm_inputs(config: Pi05Config):
    pg, ae = config.paligemma, config.action_expert
    embedded = [jnp.zeros((1, 1, pg.width)), jnp.zeros((1, 1, ae.width))]
    return embedded, [None, jnp.zeros((1, ae.width))]


@functools.partial(jax.jit, static_argnums=(0, 2))
def _init_layer(config: Pi05Config, rng: jax.Array, dtype: str) -> dict:
    embedded, cond = _dummy_llm_inputs(config)
    block = gemma.Block(_llm(config).configs, config.kernels)
    params = block.init(rng, embedded, None, jnp.zeros((1, 2), jnp.int32), jnp.ones((1, 2, 2), bool), cond)
    return cast_params(params["params"], dtype)


@functools.partial(jax.jit, static_argnums=(0, 2))
def _init_outside_layers(config: Pi05Config, keys: jax.Array, dtype: str) -> dict:
    """Everything but the Gemma layers: embedder, final norms, SigLIP, action and time projections."""
    llm, ae = _llm(config), config.action_expert
    embedded, cond = _dummy_llm_inputs(config)
    llm_params = {
        **llm.init(keys[0], embedded, cond, method="final_norm")["params"],
        **llm.init(keys[0], jnp.zeros((1, 1), jnp.int32), method="embed")["params"],
    }
    image = jnp.zeros((1, config.image_size, config.image_size, 3))
    img_params = _vision(config).init(keys[1], image)["params"]

    def dense(key, n_in, n_out):
        return _dense(n_out).init(key, jnp.zeros((1, n_in)))["params"]

    params = {
        "PaliGemma": {"llm": llm_params, "img": img_params},
        "action_in_proj": dense(keys[2], config.action_dim, ae.width),
        "action_out_proj": dense(keys[3], ae.width, config.action_dim),
        "time_mlp_in": dense(keys[4], ae.width, ae.width),
        "time_mlp_out": dense(keys[5], ae.width, ae.width),
    }
    return cast_params(params, dtype)


def init_params(config: Pi05Config, rng: jax.Array, stacked: bool = True, dtype: str = "float32") -> dict:
    """Random params with openpi's initializers, created in `dtype`.

    stacked=True: openpi's tree; stacked=False: the engine's runtime layout (`runtime_layout`). Each
    layer comes from its own call of one compiled init, so memory peaks at the params plus one layer's
    temporaries: the full model never holds a float32 copy, nor its layers twice.
    """
    keys = jax.random.split(rng, 6)
    layers = tuple(
        _init_layer(config, key, dtype) for key in jax.random.split(keys[0], config.paligemma.depth)
    )
    params = _init_outside_layers(config, keys, dtype)
    params["PaliGemma"]["llm"]["layers"] = gemma.openpi_layers(layers) if stacked else layers
    return params


def param_shapes(config: Pi05Config) -> dict:
    """The param tree as ShapeDtypeStructs, without allocating it."""
    return jax.eval_shape(lambda: init_params(config, jax.random.key(0)))


def cast_params(params: dict, dtype) -> dict:
    return jax.tree.map(lambda x: x.astype(dtype), params)


def runtime_layout(params: dict) -> dict:
    """The Gemma layers as a tuple of per-layer trees, attention weights D-first (see
    `gemma.runtime_layers`). Every function here takes either layout; the engine keeps this one."""
    llm = params["PaliGemma"]["llm"]
    if not isinstance(llm["layers"], dict):
        return params
    llm = {**llm, "layers": gemma.runtime_layers(llm["layers"])}
    return {**params, "PaliGemma": {**params["PaliGemma"], "llm": llm}}


def _run_llm(
    params: dict,
    config: Pi05Config,
    embedded,
    positions,
    mask,
    adarms_cond=None,
    kv_cache=None,
    write_idx=None,
):
    """The Gemma stack plus final norms. Returns (normed outputs per expert, per-layer (k, v)); see
    `gemma.run_layers`."""
    llm, llm_params = _llm(config), params["PaliGemma"]["llm"]
    out, new_kv = gemma.run_layers(
        llm_params["layers"],
        llm.configs,
        config.kernels,
        config.dtype,
        embedded,
        positions,
        mask,
        adarms_cond,
        kv_cache,
        write_idx,
    )
    if adarms_cond is None:
        adarms_cond = [None] * len(out)
    return llm.apply({"params": llm_params}, out, adarms_cond, method="final_norm"), new_kv


def _stack_kv(new_kv: list[tuple[jax.Array, jax.Array]]) -> tuple[jax.Array, jax.Array]:
    return jnp.stack([k for k, _ in new_kv]), jnp.stack([v for _, v in new_kv])


def make_attn_mask(input_mask: jax.Array, ar_mask: jax.Array) -> jax.Array:
    """big_vision block-causal mask: a token sees valid tokens whose cumulative ar_mask <= its own."""
    ar_mask = jnp.broadcast_to(ar_mask, input_mask.shape)
    cumsum = jnp.cumsum(ar_mask, axis=1)
    attn = cumsum[:, None, :] <= cumsum[:, :, None]
    valid = input_mask[:, None, :] & input_mask[:, :, None]
    return attn & valid


def embed_prefix(params: dict, config: Pi05Config, obs: Observation, skip_cameras: tuple[str, ...] = ()):
    """Camera + prompt tokens. Returns (tokens [B, P, D], input mask [B, P], ar_mask [P]).

    Cameras in `skip_cameras` (masked for every row) are left out entirely: their tokens would be
    invisible anyway, and positions only count valid tokens, so the results are the same.
    """
    tokens, masks = [], []
    cameras = [key for key in config.image_keys if key not in skip_cameras]
    for key in cameras:
        image_tokens = _vision(config).apply({"params": params["PaliGemma"]["img"]}, obs.images[key])
        tokens.append(image_tokens)
        masks.append(jnp.broadcast_to(obs.image_masks[key][:, None], image_tokens.shape[:2]))
    llm_params = {"params": params["PaliGemma"]["llm"]}
    tokens.append(_llm(config).apply(llm_params, obs.tokenized_prompt, method="embed"))
    masks.append(obs.tokenized_prompt_mask)
    n_image = len(cameras) * config.image_tokens
    text_causal = config.prefix_attention == "causal_text"
    ar_mask = jnp.array([False] * n_image + [text_causal] * obs.tokenized_prompt.shape[1])
    return jnp.concatenate(tokens, axis=1), jnp.concatenate(masks, axis=1).astype(bool), ar_mask


def last_valid_index(mask: jax.Array) -> jax.Array:
    """Index of the last True column of each row of mask [B, P]."""
    return mask.shape[1] - 1 - jnp.argmax(mask[:, ::-1], axis=1)


def prefix_forward(
    params: dict, config: Pi05Config, obs: Observation, skip_cameras: tuple[str, ...] = ()
) -> tuple[PrefixCache, jax.Array]:
    """The prefix pass. Returns (cache, final-normed prefix hidden states [B, P, D])."""
    tokens, mask, ar_mask = embed_prefix(params, config, obs, skip_cameras)
    positions = jnp.cumsum(mask, axis=1) - 1
    (hidden, _), new_kv = _run_llm(params, config, [tokens, None], positions, make_attn_mask(mask, ar_mask))
    k, v = _stack_kv(new_kv)
    last = jnp.take_along_axis(hidden, last_valid_index(mask)[:, None, None], axis=1)[:, 0]
    cache = PrefixCache(k=k, v=v, mask=mask, positions=positions, length=mask.sum(axis=1), last_hidden=last)
    return cache, hidden


def prefill(
    params: dict, config: Pi05Config, obs: Observation, skip_cameras: tuple[str, ...] = ()
) -> PrefixCache:
    return prefix_forward(params, config, obs, skip_cameras)[0]


def posemb_sincos(t: jax.Array, width: int, min_period: float, max_period: float) -> jax.Array:
    """Sine-cosine embedding of scalar times t [B] -> [B, width]."""
    fraction = jnp.linspace(0.0, 1.0, width // 2)
    period = min_period * (max_period / min_period) ** fraction
    angles = jnp.einsum("i,j->ij", t, 1.0 / period * 2 * jnp.pi, precision=jax.lax.Precision.HIGHEST)
    return jnp.concatenate([jnp.sin(angles), jnp.cos(angles)], axis=-1)


def embed_suffix(params: dict, config: Pi05Config, x_t: jax.Array, time: jax.Array):
    """Noisy actions [B, H, A] and time [B] -> (action tokens [B, H, D], adaRMS condition [B, D])."""
    width = config.action_expert.width
    tokens = _dense(width).apply({"params": params["action_in_proj"]}, x_t)
    cond = posemb_sincos(time, width, min_period=4e-3, max_period=4.0)
    cond = nn.swish(_dense(width).apply({"params": params["time_mlp_in"]}, cond))
    cond = nn.swish(_dense(width).apply({"params": params["time_mlp_out"]}, cond))
    return tokens, cond


def predict_velocity(
    params: dict, config: Pi05Config, cache: PrefixCache, x_t: jax.Array, time: jax.Array
) -> jax.Array:
    """Flow velocity v_t [B, H, A]: action tokens see every valid prefix column and each other."""
    tokens, cond = embed_suffix(params, config, x_t, time)
    batch, horizon = x_t.shape[:2]
    mask = jnp.concatenate(
        [
            jnp.broadcast_to(cache.mask[:, None, :], (batch, horizon, cache.mask.shape[1])),
            jnp.ones((batch, horizon, horizon), bool),
        ],
        axis=-1,
    )
    positions = cache.length[:, None] + jnp.arange(horizon)[None, :]
    (_, out), _ = _run_llm(params, config, [None, tokens], positions, mask, [None, cond], (cache.k, cache.v))
    return _dense(config.action_dim).apply({"params": params["action_out_proj"]}, out)


def denoise(
    params: dict, config: Pi05Config, cache: PrefixCache, noise: jax.Array, num_steps: int | jax.Array
) -> jax.Array:
    """Euler integration of the flow from t=1 (noise) to t=0 (actions). num_steps may be traced."""
    dt = (-1.0 / jnp.asarray(num_steps, jnp.float32)).astype(jnp.float32)

    def step(carry):
        x_t, time = carry
        v_t = predict_velocity(params, config, cache, x_t, jnp.broadcast_to(time, x_t.shape[:1]))
        return x_t + dt * v_t, time + dt

    x_0, _ = jax.lax.while_loop(lambda c: c[1] >= -dt / 2, step, (noise, jnp.float32(1.0)))
    return x_0


def sample_actions(
    params: dict, config: Pi05Config, obs: Observation, noise: jax.Array, num_steps: int | jax.Array = 10
) -> jax.Array:
    return denoise(params, config, prefill(params, config, obs), noise, num_steps)


def text_forward(
    params: dict,
    config: Pi05Config,
    tokens: jax.Array,
    positions: jax.Array,
    kv_cache: tuple,
    kv_valid: jax.Array,
    write_idx: jax.Array | None = None,
):
    """Language tokens [B, T] through the PaliGemma expert against cached columns.

    kv_cache: (k, v), each indexable by layer to [B, S, K, H]. Each token sees the valid cached columns
    (kv_valid [B, S]) and the tokens before it (causal).
    Returns (final-normed hidden [B, T, D], per layer (k, v) [B, T, K, H] of these tokens).

    With write_idx [B] (decoding into a batch state): the tokens' K/V go into the cache at columns
    write_idx[b] + t (out of range: not written) before attention, kv_valid must already mark them, and
    the per-layer (k, v) returned are the updated caches.
    """
    length = tokens.shape[1]
    if write_idx is None:
        causal = jnp.tril(jnp.ones((length, length), bool))
        mask = jnp.concatenate(
            [
                jnp.broadcast_to(kv_valid[:, None, :], (tokens.shape[0], length, kv_valid.shape[1])),
                jnp.broadcast_to(causal, (tokens.shape[0], length, length)),
            ],
            axis=-1,
        )
    else:  # token t sees no column written for a later token
        columns = jnp.arange(kv_valid.shape[1])
        mask = kv_valid[:, None, :] & (
            columns[None, None, :] <= write_idx[:, None, None] + jnp.arange(length)[:, None]
        )
    embedded = _llm(config).apply({"params": params["PaliGemma"]["llm"]}, tokens, method="embed")
    (hidden, _), new_kv = _run_llm(
        params, config, [embedded, None], positions, mask, None, kv_cache, write_idx
    )
    return hidden, new_kv


def text_logits(params: dict, config: Pi05Config, hidden: jax.Array) -> jax.Array:
    """Tied-embedding language head: hidden [..., D] -> float32 logits [..., vocab]."""
    return _llm(config).apply({"params": params["PaliGemma"]["llm"]}, hidden, method="logits")
