"""LoRA on the Gemma experts, with openpi's parameter names, shapes, init and freeze rule.

openpi's `gemma_2b_lora` / `gemma_300m_lora` variants add, per layer (stacked on axis 0 like the weight):
`attn/q_einsum/{lora_a, lora_b}`, `attn/kv_einsum/...`, `attn/attn_vec_einsum/...` and
`mlp/{gating_einsum, linear}_lora_{a, b}` (expert 1: the `_1` modules), A = the weight's shape with the
last axis replaced by the rank, B = rank x the last axis, both drawn N(0, 0.01), scaled by alpha/rank
(alpha = rank in openpi's variants, so 1). Its output projection sums B over heads
(`BTL,NLD->BTD`); the merge below keeps that.

Here the adapters are merged into the weights (W + A @ B, in float32) before the unchanged model runs:
the same function with one model implementation. Under float32 compute this is openpi's LoRA up to
float reassociation; under bfloat16 compute the model casts the merged weight, so a delta below a
weight's bfloat16 resolution is rounded in the forward pass (openpi runs the low-rank branch
separately). Serving params are the merged tree, which `infer.py`, `serve.py` and openpi's non-LoRA
config load unchanged.

Freezing follows openpi's `Pi0Config.get_freeze_filter`: LoRA on the PaliGemma expert freezes every
`llm` param (the action expert's too unless it also has LoRA, in which case it is frozen as well), LoRA
on the action expert alone freezes the `llm` params with `_1`; LoRA params themselves always train.
"""

import dataclasses
import re

import jax
import jax.numpy as jnp
from flax import traverse_util

_LAYERS = ("PaliGemma", "llm", "layers")
_INIT_STD = 0.01


@dataclasses.dataclass(frozen=True)
class LoraConfig:
    """Rank per expert (0: no LoRA on it); alpha = rank as in openpi's variants (scale 1)."""

    paligemma_rank: int = 0
    action_expert_rank: int = 0

    @property
    def enabled(self) -> bool:
        return bool(self.paligemma_rank or self.action_expert_rank)


@dataclasses.dataclass(frozen=True)
class _Adapted:
    module: str  # under PaliGemma/llm/layers, without the expert suffix
    weight: str
    a: str
    b: str
    sum_b_over_heads: bool = False


_ADAPTED = (
    _Adapted("attn/q_einsum", "w", "lora_a", "lora_b"),
    _Adapted("attn/kv_einsum", "w", "lora_a", "lora_b"),
    _Adapted("attn/attn_vec_einsum", "w", "lora_a", "lora_b", sum_b_over_heads=True),
    _Adapted("mlp", "gating_einsum", "gating_einsum_lora_a", "gating_einsum_lora_b"),
    _Adapted("mlp", "linear", "linear_lora_a", "linear_lora_b"),
)


def _sites(config: LoraConfig):
    """(module path tuple, adapted spec, rank) of every adapted weight."""
    for expert, rank in enumerate((config.paligemma_rank, config.action_expert_rank)):
        if not rank:
            continue
        for spec in _ADAPTED:
            *parents, name = spec.module.split("/")
            yield (*_LAYERS, *parents, name if expert == 0 else f"{name}_{expert}"), spec, rank


def add_lora(params: dict, config: LoraConfig, rng: jax.Array) -> dict:
    """params (openpi's stacked tree) plus freshly drawn LoRA leaves."""
    flat = traverse_util.flatten_dict(params)
    sites = list(_sites(config))
    for key, (module, spec, rank) in zip(jax.random.split(rng, len(sites)), sites, strict=True):
        w = flat[(*module, spec.weight)]
        key_a, key_b = jax.random.split(key)
        shape_a = (*w.shape[:-1], rank)
        shape_b = (*w.shape[:-2], rank, w.shape[-1])
        flat[(*module, spec.a)] = _INIT_STD * jax.random.normal(key_a, shape_a, jnp.float32)
        flat[(*module, spec.b)] = _INIT_STD * jax.random.normal(key_b, shape_b, jnp.float32)
    return traverse_util.unflatten_dict(flat)


def merge_lora(params: dict, config: LoraConfig) -> dict:
    """The model's tree: each adapted weight W + A @ B (float32), LoRA leaves removed."""
    if not config.enabled:
        return params
    flat = dict(traverse_util.flatten_dict(params))
    for module, spec, _ in _sites(config):
        a = flat.pop((*module, spec.a)).astype(jnp.float32)
        b = flat.pop((*module, spec.b)).astype(jnp.float32)
        if spec.sum_b_over_heads:
            b = jnp.sum(b, axis=1, keepdims=True)
        flat[(*module, spec.weight)] = flat[(*module, spec.weight)].astype(jnp.float32) + a @ b
    return traverse_util.unflatten_dict(flat)


def frozen_by_lora(path: str, config: LoraConfig) -> bool:
    """openpi's freeze filter for LoRA variants, on "/"-joined param paths."""
    if not config.enabled or re.fullmatch(".*lora.*", path):
        return False
    in_llm = re.fullmatch(".*llm.*", path) is not None
    in_action_expert = re.fullmatch(".*llm.*_1.*", path) is not None
    if config.paligemma_rank:
        return in_llm and (config.action_expert_rank > 0 or not in_action_expert)
    return in_action_expert
