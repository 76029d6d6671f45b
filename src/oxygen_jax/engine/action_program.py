"""The action path as one program: prefill + denoise, one dispatch per frame instead of two.

The cache the program returns (for language) is padded back to the prompt's width
(`prompt_buckets.pad_cache`); the denoiser reads the cut one, whose columns are the cache's valid ones.
`denoiser` picks the plain, guided or conditioned denoiser (`engine/guidance.py`) statically, as
`Engine.denoise` picks among its programs.
"""

import jax

from oxygen_jax.engine import guidance as guidance_lib
from oxygen_jax.engine import prompt_buckets
from oxygen_jax.models import pi05

DENOISERS = ("plain", "guided", "conditioned")


def act(
    params: dict,
    config: pi05.Pi05Config,
    obs: pi05.Observation,
    noise: jax.Array,
    num_steps: int,
    skip_cameras: tuple[str, ...] = (),
    pad: int = 0,
    denoiser: str = "plain",
    guidance: guidance_lib.Guidance | None = None,
) -> tuple[pi05.PrefixCache, jax.Array]:
    """(prefix cache padded by `pad` prompt columns, actions [B, H, A]) of a (cut) observation."""
    cache = pi05.prefill(params, config, obs, skip_cameras)
    if denoiser == "plain":
        actions = pi05.denoise(params, config, cache, noise, num_steps)
    elif denoiser == "guided":
        actions = guidance_lib.guided_denoise(params, config, cache, noise, num_steps, guidance)
    else:
        actions = guidance_lib.conditioned_denoise(params, config, cache, noise, num_steps, guidance)
    return prompt_buckets.pad_cache(cache, pad), actions
