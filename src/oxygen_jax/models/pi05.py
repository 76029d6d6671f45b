"""pi0.5: SigLIP + two-expert Gemma with flow-matching actions: one module (`Pi05`) and pure functions
over `params` that apply it.

The prefix (camera tokens + prompt tokens) runs once through the PaliGemma expert and leaves a
`PrefixCache`; the action expert denoises against it without ever writing it, and language decoding
(engine/) reads the same cache. Param tree and numerics are openpi's `Pi0(pi05=True)`.
"""

import dataclasses
import functools
from collections.abc import Callable

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

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
    # True: layers stacked over depth and scanned (openpi's param tree, as checkpoints store it); False:
    # one param tree per layer run as a loop (`runtime_layout`, which the engine uses).
    scan_layers: bool = True
    # With scan_layers=False: each layer's q and kv weights fused into one `qkv_einsum` [D, N + 2K, H], one
    # projection instead of two (`fused_layout`; the engine's choice without a model-parallel mesh).
    fused_qkv: bool = False
    # > 0: trained with up to this many leading actions of the chunk given clean (flow time 0 on their
    # tokens, `training/loss.py`), so real-time chunking conditions on the actions the robot executes
    # meanwhile instead of guiding towards them (`engine/guidance.py`).
    max_clean_prefix: int = 0

    def __post_init__(self):
        if self.prefix_attention not in ("bidirectional", "causal_text"):
            raise ValueError(
                f"prefix_attention must be 'bidirectional' or 'causal_text', got {self.prefix_attention!r}"
            )
        if not 0 <= self.max_clean_prefix < self.action_horizon:
            raise ValueError(
                f"max_clean_prefix must lie in [0, {self.action_horizon - 1}], got {self.max_clean_prefix}"
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


class _PaliGemma(nn.Module):
    """openpi's `PaliGemma` holder: the two-expert language model and the image encoder."""

    config: Pi05Config

    def setup(self):
        c = self.config
        experts = (c.paligemma, c.action_expert)
        self.llm = gemma.Transformer(
            experts, c.vocab_size, c.dtype, c.kernels, scan=c.scan_layers, fused_qkv=c.fused_qkv
        )
        self.img = siglip.Siglip(c.vision, c.paligemma.width, c.dtype, scan=c.scan_layers)


class Pi05(nn.Module):
    """pi0.5's modules, named as openpi names them: `init` gives openpi's param tree (in the layout of
    `config.scan_layers`). The module-level functions below apply its methods to a params tree."""

    config: Pi05Config

    def setup(self):
        width = self.config.action_expert.width
        self.PaliGemma = _PaliGemma(self.config)
        self.action_in_proj = nn.Dense(width)
        self.action_out_proj = nn.Dense(self.config.action_dim)
        self.time_mlp_in = nn.Dense(width)
        self.time_mlp_out = nn.Dense(width)

    def __call__(self, obs: Observation, x_t: jax.Array, time: jax.Array) -> jax.Array:
        """Flow velocity at (x_t, time) for `obs`: the prefix pass, then the action expert against its
        cache. It reaches every param, so `init` through it builds the whole tree."""
        return self.predict_velocity(self.prefix_forward(obs)[0], x_t, time)

    def embed_images(self, obs: Observation, cameras: tuple[str, ...]):
        if not cameras:
            return [], []
        stacked = self.PaliGemma.img(jnp.concatenate([obs.images[key] for key in cameras]))
        tokens = jnp.split(stacked, len(cameras))
        masks = [
            jnp.broadcast_to(obs.image_masks[key][:, None], t.shape[:2])
            for key, t in zip(cameras, tokens, strict=True)
        ]
        return tokens, masks

    def embed_prefix(self, obs: Observation, skip_cameras: tuple[str, ...] = ()):
        config = self.config
        cameras = tuple(key for key in config.image_keys if key not in skip_cameras)
        tokens, masks = self.embed_images(obs, cameras)
        tokens.append(self.PaliGemma.llm.embed(obs.tokenized_prompt))
        masks.append(obs.tokenized_prompt_mask)
        n_image = len(cameras) * config.image_tokens
        text_causal = config.prefix_attention == "causal_text"
        ar_mask = jnp.array([False] * n_image + [text_causal] * obs.tokenized_prompt.shape[1])
        return jnp.concatenate(tokens, axis=1), jnp.concatenate(masks, axis=1).astype(bool), ar_mask

    def prefix_forward(self, obs: Observation, skip_cameras: tuple[str, ...] = ()):
        return self._prefix(obs, skip_cameras, full_hidden=True)

    def prefill(self, obs: Observation, skip_cameras: tuple[str, ...] = ()) -> PrefixCache:
        return self._prefix(obs, skip_cameras, full_hidden=False)[0]

    def _prefix(self, obs: Observation, skip_cameras: tuple[str, ...], full_hidden: bool):
        """(cache, final-normed hidden [B, P, D] or, without full_hidden, None: then the last layer's
        attention and MLP run for the last valid column only, whose hidden `last_hidden` is)."""
        tokens, mask, ar_mask = self.embed_prefix(obs, skip_cameras)
        positions = jnp.cumsum(mask, axis=1) - 1
        last = last_valid_index(mask)
        (hidden, _), (k, v) = self.PaliGemma.llm(
            [tokens, None],
            positions,
            make_attn_mask(mask, ar_mask),
            last_layer_rows=None if full_hidden else last,
        )
        cache = PrefixCache(
            k=gemma.stack_layers(k),
            v=gemma.stack_layers(v),
            mask=mask,
            positions=positions,
            length=mask.sum(axis=1),
            last_hidden=gemma.take_rows(hidden, last if full_hidden else jnp.zeros_like(last))[:, 0],
        )
        return cache, hidden if full_hidden else None

    def time_condition(self, time: jax.Array) -> jax.Array:
        cond = posemb_sincos(time, self.config.action_expert.width, min_period=4e-3, max_period=4.0)
        return nn.swish(self.time_mlp_out(nn.swish(self.time_mlp_in(cond))))

    def embed_suffix(self, x_t: jax.Array, time: jax.Array):
        return self.action_in_proj(x_t), self.time_condition(time)

    def predict_velocity(self, cache: PrefixCache, x_t: jax.Array, time: jax.Array) -> jax.Array:
        return self.velocity(cache, x_t, self.time_condition(time))

    def velocity(self, cache: PrefixCache, x_t: jax.Array, condition) -> jax.Array:
        tokens = self.action_in_proj(x_t)
        batch, horizon = x_t.shape[:2]
        mask = jnp.concatenate(
            [
                jnp.broadcast_to(cache.mask[:, None, :], (batch, horizon, cache.mask.shape[1])),
                jnp.ones((batch, horizon, horizon), bool),
            ],
            axis=-1,
        )
        positions = cache.length[:, None] + jnp.arange(horizon)[None, :]
        (_, out), _ = self.PaliGemma.llm(
            [None, tokens], positions, mask, [None, condition], (cache.k, cache.v)
        )
        return self.action_out_proj(out)

    def text_forward(self, tokens, positions, kv_cache, kv_valid, write_idx=None):
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
        embedded = self.PaliGemma.llm.embed(tokens)
        (hidden, _), new_kv = self.PaliGemma.llm([embedded, None], positions, mask, None, kv_cache, write_idx)
        return hidden, new_kv

    def text_logits(self, hidden: jax.Array) -> jax.Array:
        return self.PaliGemma.llm.logits(hidden)


def _apply(params: dict, config: Pi05Config, method, *args):
    return Pi05(config).apply({"params": params}, *args, method=method)


def _dummy_observation(config: Pi05Config) -> Observation:
    image = jnp.zeros((1, config.image_size, config.image_size, 3))
    return Observation(
        images=dict.fromkeys(config.image_keys, image),
        image_masks=dict.fromkeys(config.image_keys, jnp.ones(1, bool)),
        tokenized_prompt=jnp.zeros((1, 1), jnp.int32),
        tokenized_prompt_mask=jnp.ones((1, 1), bool),
    )


@functools.partial(jax.jit, static_argnames=("config", "dtype"))
def _init(config: Pi05Config, rng: jax.Array, dtype: str) -> dict:
    x_t = jnp.zeros((1, config.action_horizon, config.action_dim))
    params = Pi05(config).init(rng, _dummy_observation(config), x_t, jnp.ones(1))["params"]
    return cast_params(params, dtype)


@functools.partial(jax.jit, static_argnames=("config", "dtype"))
def _init_layer(config: Pi05Config, rng: jax.Array, dtype: str) -> dict:
    """One layer as the unscanned `gemma.Transformer` holds it."""
    pg, ae = config.paligemma, config.action_expert
    block = gemma.Block((pg, ae), config.kernels, d_first=True, fused_qkv=config.fused_qkv)
    xs = [jnp.zeros((1, 1, pg.width)), jnp.zeros((1, 1, ae.width))]
    positions, mask, cond = (
        jnp.zeros((1, 2), jnp.int32),
        jnp.ones((1, 2, 2), bool),
        [None, jnp.zeros((1, ae.width))],
    )
    return cast_params(block.init(rng, xs, None, positions, mask, cond, None)["params"], dtype)


@functools.partial(jax.jit, static_argnames=("config", "dtype"))
def _init_vision_block(config: Pi05Config, rng: jax.Array, dtype: str) -> dict:
    """One vision encoder layer as the unscanned `siglip.Encoder` holds it."""
    v = config.vision
    block = siglip.EncoderBlock(v.mlp_dim, v.num_heads, config.dtype, fused_qkv=True)
    return cast_params(block.init(rng, jnp.zeros((1, 1, v.width)), None)["params"], dtype)


def init_params(config: Pi05Config, rng: jax.Array, stacked: bool = True, dtype: str = "float32") -> dict:
    """Random params with openpi's initializers, from the modules' init, cast to `dtype` in the same
    compiled call (the forward pass init traces is dead code there and is not run).

    stacked=True: openpi's tree, `Pi05`'s init. stacked=False: the engine's runtime layout
    (`runtime_layout`), made one layer at a time, so a full model's layers never wait in float32
    together nor compile as one program: `Pi05` with one-layer stacks, then one compiled
    `gemma.Block` and `siglip.EncoderBlock` init for each further layer.
    """
    if stacked:
        return _init(dataclasses.replace(config, scan_layers=True), rng, dtype)
    first_key, *layer_keys = jax.random.split(rng, config.paligemma.depth)
    one_layer = dataclasses.replace(
        config,
        scan_layers=False,
        paligemma=dataclasses.replace(config.paligemma, depth=1),
        action_expert=dataclasses.replace(config.action_expert, depth=1),
        vision=dataclasses.replace(config.vision, depth=1),
    )
    params = _init(one_layer, first_key, dtype)
    params["PaliGemma"]["llm"].update(
        {gemma.layer_name(i): _init_layer(config, key, dtype) for i, key in enumerate(layer_keys, 1)}
    )
    vision_keys = jax.random.split(jax.random.fold_in(rng, 1), config.vision.depth - 1)
    params["PaliGemma"]["img"]["Transformer"].update(
        {siglip.block_name(i): _init_vision_block(config, key, dtype) for i, key in enumerate(vision_keys, 1)}
    )
    return params


def param_shapes(config: Pi05Config, stacked: bool = True) -> dict:
    """The param tree (stacked: openpi's, else the runtime layout) as ShapeDtypeStructs, unallocated."""
    return jax.eval_shape(lambda: init_params(config, jax.random.key(0), stacked))


def cast_params(params: dict, dtype) -> dict:
    return jax.tree.map(lambda x: x.astype(dtype), params)


def runtime_layout(params: dict) -> dict:
    """openpi's tree -> the engine's runtime layout (per-layer trees; language model attention q/kv
    D-first, see `models/gemma.py`; vision query/key/value fused, see `models/siglip.py`), which
    `scan_layers=False` runs. A tree already in that layout passes through."""
    llm = params["PaliGemma"]["llm"]
    if "layers" in llm:
        llm = {k: v for k, v in llm.items() if k != "layers"} | gemma.runtime_layers(llm["layers"])
    img = params["PaliGemma"]["img"]
    img = {**img, "Transformer": siglip.runtime_encoder(img["Transformer"])}
    return {**params, "PaliGemma": {**params["PaliGemma"], "llm": llm, "img": img}}


def fused_layout(params: dict) -> dict:
    """The runtime layout (`runtime_layout`) with each layer's q and kv weights fused (`gemma.fused_layers`),
    which `scan_layers=False, fused_qkv=True` runs. A tree already fused passes through."""
    llm = params["PaliGemma"]["llm"]
    return {**params, "PaliGemma": {**params["PaliGemma"], "llm": gemma.fused_layers(llm)}}


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
    return _apply(params, config, Pi05.embed_prefix, obs, skip_cameras)


def embed_images(
    params: dict, config: Pi05Config, obs: Observation, cameras: tuple[str, ...]
) -> tuple[list[jax.Array], list[jax.Array]]:
    """The image part of `embed_prefix`: per camera, in the order given, tokens [B, image_tokens, D] and
    mask [B, image_tokens]. The cameras' images go through one encoder call, stacked on the batch axis
    (camera-major), so each layer runs one set of matmuls over every camera's patches."""
    return _apply(params, config, Pi05.embed_images, obs, cameras)


def last_valid_index(mask: jax.Array) -> jax.Array:
    """Index of the last True column of each row of mask [B, P]."""
    return mask.shape[1] - 1 - jnp.argmax(mask[:, ::-1], axis=1)


def prefix_forward(
    params: dict, config: Pi05Config, obs: Observation, skip_cameras: tuple[str, ...] = ()
) -> tuple[PrefixCache, jax.Array]:
    """The prefix pass. Returns (cache, final-normed prefix hidden states [B, P, D])."""
    return _apply(params, config, Pi05.prefix_forward, obs, skip_cameras)


def prefill(
    params: dict, config: Pi05Config, obs: Observation, skip_cameras: tuple[str, ...] = ()
) -> PrefixCache:
    """The prefix pass for its cache only: the last layer runs its attention and MLP for the last valid
    column alone (`last_hidden`'s), its keys/values for every column."""
    return _apply(params, config, Pi05.prefill, obs, skip_cameras)


def posemb_sincos(t: jax.Array, width: int, min_period: float, max_period: float) -> jax.Array:
    """Sine-cosine embedding of times t [B] (or [B, H], one per token) -> [..., width]."""
    fraction = jnp.linspace(0.0, 1.0, width // 2)
    period = min_period * (max_period / min_period) ** fraction
    angles = jnp.einsum("...,j->...j", t, 1.0 / period * 2 * jnp.pi, precision=jax.lax.Precision.HIGHEST)
    return jnp.concatenate([jnp.sin(angles), jnp.cos(angles)], axis=-1)


def embed_suffix(params: dict, config: Pi05Config, x_t: jax.Array, time: jax.Array):
    """Noisy actions [B, H, A] and time [B] (or [B, H]) -> (action tokens [B, H, D], adaRMS condition
    [B, D] (or [B, H, D]))."""
    return _apply(params, config, Pi05.embed_suffix, x_t, time)


def predict_velocity(
    params: dict, config: Pi05Config, cache: PrefixCache, x_t: jax.Array, time: jax.Array
) -> jax.Array:
    """Flow velocity v_t [B, H, A]: action tokens see every valid prefix column and each other. time is
    [B], or [B, H] for a time per action token (a clean prefix, `Pi05Config.max_clean_prefix`)."""
    return _apply(params, config, Pi05.predict_velocity, cache, x_t, time)


def flow_times(num_steps: int) -> np.ndarray:
    """The flow times [num_steps] of openpi's Euler loop, replayed on the host in float32 (`time = 1;
    while time >= -dt / 2: ...; time += dt` with dt = float32(-1 / num_steps)), so a loop of compile-time
    length steps through exactly openpi's times."""
    dt = flow_dt(num_steps)
    times, time = [], np.float32(1.0)
    while time >= -dt / np.float32(2):
        times.append(time)
        time = np.float32(time + dt)
    return np.array(times, np.float32)


def flow_dt(num_steps: int) -> np.float32:
    """openpi's Euler step, -1 / num_steps in float32."""
    return np.float32(-1.0) / np.float32(num_steps)


def flow_conditions(params: dict, config: Pi05Config, times: jax.Array):
    """The action expert's conditioning at flow times [S], computed once for all of them: the time MLP, and
    in the runtime layout every adaRMS norm's modulation (`gemma.AdaRMS`). Each leaf has S leading; a
    step's slice is what `velocity` takes."""
    cond = _apply(params, config, Pi05.time_condition, times)
    if config.scan_layers:
        return cond
    return gemma.adarms_modulations(params["PaliGemma"]["llm"], cond, expert=1, dtype=config.dtype)


def velocity(params: dict, config: Pi05Config, cache: PrefixCache, x_t: jax.Array, condition) -> jax.Array:
    """`predict_velocity` with the action expert's conditioning given: one step's slice of
    `flow_conditions` (shared by every row), or one per row or token along its leading dims."""
    return _apply(params, config, Pi05.velocity, cache, x_t, condition)


def denoise(
    params: dict, config: Pi05Config, cache: PrefixCache, noise: jax.Array, num_steps: int | jax.Array
) -> jax.Array:
    """Euler integration of the flow from t=1 (noise) to t=0 (actions).

    num_steps a Python int (static under jit, as the engine passes it): `integrate_flow`, a loop of
    compile-time length with the conditioning computed before it. Traced: openpi's while loop on the float
    time, one program for every step count, the conditioning computed in every step.
    """
    if not isinstance(num_steps, int | np.integer):
        return _denoise_traced(params, config, cache, noise, num_steps)

    def step_velocity(x_t, _time, condition):
        return velocity(params, config, cache, x_t, condition)

    return integrate_flow(
        step_velocity, noise, num_steps, lambda times: flow_conditions(params, config, times), config.kernels
    )


def _denoise_traced(params, config, cache, noise, num_steps):
    dt = (-1.0 / jnp.asarray(num_steps, jnp.float32)).astype(jnp.float32)

    def step(carry):
        x_t, time = carry
        v_t = predict_velocity(params, config, cache, x_t, jnp.broadcast_to(time, x_t.shape[:1]))
        return x_t + dt * v_t, time + dt

    x_0, _ = jax.lax.while_loop(lambda c: c[1] >= -dt / 2, step, (noise, jnp.float32(1.0)))
    return x_0


def integrate_flow(
    velocity: Callable[[jax.Array, jax.Array, object], jax.Array],
    noise: jax.Array,
    num_steps: int,
    conditions: Callable[[jax.Array], object],
    kernels: gemma.Kernels,
) -> jax.Array:
    """Euler steps of velocity(x_t, t, condition) over openpi's flow times (`flow_times`), dt = -1/num_steps:
    every denoiser's loop (plain, guided, conditioned). conditions(times [S]) -> a pytree with S leading,
    computed once before the loop; each step gets its slice. The loop's trip count is a compile-time
    constant (a scan over the times; fully unrolled with `kernels.unroll_loops`), so no predicate goes
    to the host between steps."""
    times = jnp.asarray(flow_times(num_steps))
    dt = flow_dt(num_steps)

    def step(x_t, inputs):
        time, condition = inputs
        return x_t + dt * velocity(x_t, time, condition), None

    x_0, _ = jax.lax.scan(step, noise, (times, conditions(times)), unroll=kernels.unroll_loops)
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
    Returns (final-normed hidden [B, T, D], (k, v) of these tokens, each indexable by layer to
    [B, T, K, H]: see `gemma.Transformer`).

    With write_idx [B] (decoding into a batch state): the tokens' K/V go into the cache at columns
    write_idx[b] + t (out of range: not written) before attention, kv_valid must already mark them, and
    the (k, v) returned are the updated caches.
    """
    return _apply(params, config, Pi05.text_forward, tokens, positions, kv_cache, kv_valid, write_idx)


def text_logits(params: dict, config: Pi05Config, hidden: jax.Array) -> jax.Array:
    """Tied-embedding language head: hidden [..., D] -> float32 logits [..., vocab]."""
    return _apply(params, config, Pi05.text_logits, hidden)
