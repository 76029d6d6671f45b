"""openpi's policy entry point under its own name, so openpi inference scripts port by changing imports.

    from oxygen_jax import config as _config       # openpi: from openpi.training import config as _config
    from oxygen_jax.policies import policy_config  # openpi: from openpi.policies import policy_config

    cfg = _config.get_config("pi05_droid")
    policy = policy_config.create_trained_policy(cfg, "gs://openpi-assets/checkpoints/pi05_droid")
    policy.infer(example)["actions"]

`create_trained_policy` takes openpi's arguments with openpi's meaning and returns a `Policy` whose
`infer(obs)` and `metadata` are openpi's (plus text when asked for); `create_policy` is the same entry
point with this project's options spelled out.
"""

import os
from collections.abc import Mapping
from typing import Any

import ml_collections

from oxygen_jax.policies import normalization
from oxygen_jax.policies.policy import Policy, create_policy

# openpi's `sample_kwargs` that mean something for pi0.5 sampling here.
_SAMPLE_KWARGS = ("num_steps",)


def _config(train_config: Any) -> str | ml_collections.ConfigDict:
    """A config name, a loaded config, or openpi's TrainConfig (our config of the same name)."""
    if isinstance(train_config, str | ml_collections.ConfigDict):
        return train_config
    name = getattr(train_config, "name", None)
    if not isinstance(name, str):
        raise TypeError(f"train_config must be a config name or config, got {type(train_config).__name__}")
    return name


def _norm_stats(norm_stats: Mapping[str, Any]) -> dict[str, normalization.NormStats]:
    """Ours or openpi's NormStats (the same four fields) as ours."""
    fields = ("mean", "std", "q01", "q99")
    return normalization.norm_stats_from_dict(
        {key: {field: getattr(stats, field, None) for field in fields} for key, stats in norm_stats.items()}
    )


def create_trained_policy(
    train_config: Any,
    checkpoint_dir: str | os.PathLike[str] | None = None,
    *,
    repack_transforms: Any = None,
    sample_kwargs: Mapping[str, Any] | None = None,
    default_prompt: str | None = None,
    norm_stats: Mapping[str, Any] | None = None,
    pytorch_device: str | None = None,
    max_text_tokens: int = 0,
    tokenizer_path: str | None = None,
) -> Policy:
    """openpi's `policy_config.create_trained_policy`: a policy on a trained openpi checkpoint.

    train_config: a config name (`"pi05_libero"`), a loaded config (`oxygen_jax.config.get_config`), or
      openpi's own TrainConfig, whose name picks our config of that name.
    checkpoint_dir: the checkpoint (a path, a name in openpi's cache, or a `gs://` URL downloaded into
      openpi's cache as openpi does); params are restored as bfloat16, as openpi does. None: the
      config's own (`pi05_demo` ships one), else a random-initialized model.
    sample_kwargs: `num_steps` (flow-matching steps), as openpi's `sample_actions` takes it.
    default_prompt: fills observations that carry no prompt (else the robot's default, as openpi).
    norm_stats: used instead of the checkpoint's `assets/<asset_id>/norm_stats.json` (ours or openpi's).
    repack_transforms, pytorch_device: openpi's; repacking is the caller's here and PyTorch checkpoints
      are not loaded, so anything but None is refused with a one-line error.
    max_text_tokens, tokenizer_path: this project's own (language on, and where the tokenizer is).
    """
    if repack_transforms is not None and (repack_transforms.inputs or repack_transforms.outputs):
        raise ValueError(
            "repack_transforms are not applied here: repack the observation before `policy.infer` "
            "(and the result after)"
        )
    if pytorch_device is not None:
        raise ValueError("pytorch_device: only openpi's JAX checkpoints (params/) load here, not PyTorch")
    unknown = sorted(set(sample_kwargs or {}) - set(_SAMPLE_KWARGS))
    if unknown:
        raise ValueError(f"sample_kwargs {unknown} are not supported; known: {list(_SAMPLE_KWARGS)}")
    return create_policy(
        _config(train_config),
        None if checkpoint_dir is None else os.fspath(checkpoint_dir),
        tokenizer_path=tokenizer_path,
        max_text_tokens=max_text_tokens,
        default_prompt=default_prompt,
        num_steps=(sample_kwargs or {}).get("num_steps"),
        norm_stats=None if norm_stats is None else _norm_stats(norm_stats),
    )
