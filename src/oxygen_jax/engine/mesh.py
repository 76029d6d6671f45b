"""Sharding over a device mesh: `data` splits rows (prefill, denoise, σ̂'s slots), `model` splits heads.

A mesh always has the two axes `("data", "model")` (size 1 where unused). Params and activations name
their dims with logical axes (MaxText's convention), and `RULES` maps those names onto the mesh through
`flax.linen.logical_to_mesh_axes`: rows over `data`; Gemma and SigLIP heads, MLP hidden dims and the
vocabulary over `model`; params replicated over `data`. XLA's SPMD partitioner inserts every collective;
there are none written by hand. A dim the axis does not divide (MQA's single kv head, a small model's
two SigLIP heads on four devices) stays replicated.
"""

import re
from collections.abc import Sequence

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

AXES = ("data", "model")
RULES = (("batch", "data"), ("heads", "model"), ("mlp", "model"), ("vocab", "model"))
_AXIS_RE = re.compile(r"^(data|model):([1-9][0-9]*)$")


class MeshError(ValueError):
    """A mesh the flags or config ask for that this machine or the batch sizes cannot have."""


def parse_mesh(spec: str, num_devices: int | None = None) -> dict[str, int]:
    """`"data:4"` or `"data:2,model:2"` -> {"data": 4, "model": 1}, checked against the visible devices."""
    sizes = {}
    for part in spec.replace(" ", "").split(","):
        match = _AXIS_RE.match(part)
        if not match:
            raise MeshError(
                f"bad mesh {spec!r}: expected axis:size pairs such as 'data:4' or 'data:2,model:2'"
            )
        if match[1] in sizes:
            raise MeshError(f"bad mesh {spec!r}: axis {match[1]!r} given twice")
        sizes[match[1]] = int(match[2])
    sizes = {axis: sizes.get(axis, 1) for axis in AXES}
    available = jax.device_count() if num_devices is None else num_devices
    if sizes["data"] * sizes["model"] > available:
        raise MeshError(
            f"mesh {spec!r} needs {sizes['data'] * sizes['model']} devices, but {available} are visible"
        )
    return sizes


def make_mesh(sizes: dict[str, int], devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A ("data", "model") mesh over the first data x model devices (all processes' devices)."""
    devices = list(jax.devices() if devices is None else devices)[: sizes["data"] * sizes["model"]]
    return Mesh(np.array(devices).reshape(sizes["data"], sizes["model"]), AXES)


def mesh_from_spec(spec: str | None) -> Mesh | None:
    """The mesh a `--mesh` / `engine.mesh` value names; None or "" -> None (single device)."""
    return make_mesh(parse_mesh(spec)) if spec else None


def check_divides(data: int, **batch_sizes: int) -> None:
    """Every batch the engine buckets to must split evenly over the `data` devices."""
    for name, size in batch_sizes.items():
        if size % data:
            raise MeshError(f"{name}={size} is not a multiple of the mesh's data axis ({data})")


def data_size(mesh: Mesh | None) -> int:
    return 1 if mesh is None else mesh.shape["data"]


def sharding(mesh: Mesh, logical: Sequence[str | None], shape: Sequence[int]) -> NamedSharding:
    """The mesh sharding of an array whose dims have these logical names; a mesh axis that does not
    divide its dim is dropped (that dim is replicated)."""
    axes = nn.logical_to_mesh_axes(tuple(logical) + (None,) * (len(shape) - len(logical)), RULES)
    kept = [a if a is None or dim % mesh.shape[a] == 0 else None for a, dim in zip(axes, shape, strict=True)]
    return NamedSharding(mesh, PartitionSpec(*kept))


# --- params ---
# Logical names of each param's dims, by the end of its path (`_1`: the action expert's copy), in the
# engine's runtime layout (per-layer trees; a weight stacked over depth leads with "layers": a leading dim
# not named here is "layers").
_PARAM_AXES = [
    (r"q_einsum(_1)?/w", ("embed", "heads", "head_dim")),
    (r"kv_einsum(_1)?/w", ("embed", None, "kv_heads", "head_dim")),
    (r"attn_vec_einsum(_1)?/w", ("heads", "head_dim", "embed")),
    (r"mlp(_1)?/gating_einsum", (None, "embed", "mlp")),
    (r"mlp(_1)?/linear", ("mlp", "embed")),
    (r"embedder/input_embedding", ("vocab", "embed")),
    (r"MultiHeadDotProductAttention_0/qkv/kernel", ("embed", None, "heads", "head_dim")),
    (r"MultiHeadDotProductAttention_0/qkv/bias", (None, "heads", "head_dim")),
    (r"MultiHeadDotProductAttention_0/out/kernel", ("heads", "head_dim", "embed")),
    (r"MlpBlock_0/Dense_0/kernel", ("embed", "mlp")),
    (r"MlpBlock_0/Dense_0/bias", ("mlp",)),
    (r"MlpBlock_0/Dense_1/kernel", ("mlp", "embed")),
]
_PARAM_RES = [(re.compile(rf"(^|/){pattern}$"), axes) for pattern, axes in _PARAM_AXES]


def param_logical_axes(path: str, ndim: int) -> tuple[str | None, ...]:
    """Logical dim names of the param at `path` ("a/b/c"): replicated (all None) unless listed."""
    for pattern, axes in _PARAM_RES:
        if pattern.search(path):
            return ("layers",) * (ndim - len(axes)) + axes
    return (None,) * ndim


def param_shardings(params, mesh: Mesh):
    """NamedShardings for a param tree: heads, MLP hidden and vocab over `model`, replicated on `data`."""

    def one(path, x):
        name = "/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path)
        return sharding(mesh, param_logical_axes(name, x.ndim), x.shape)

    return jax.tree_util.tree_map_with_path(one, params)


# --- activations ---
def logical_sharding(mesh: Mesh, *logical: str | None) -> NamedSharding:
    """The sharding of activations whose leading dims have these logical names (any trailing dims
    replicated): shape-independent, so it can be a jit's out_shardings."""
    return nn.logical_to_mesh_sharding(PartitionSpec(*logical), mesh, RULES)


def place_rows(tree, mesh: Mesh):
    """Puts a batch (every leaf leads with its rows) over the data axis; a batch the axis does not
    divide (a single observation outside the bucketed serving path) is replicated instead."""
    return jax.tree.map(lambda x: jax.device_put(x, sharding(mesh, ("batch",), np.shape(x))), tree)
