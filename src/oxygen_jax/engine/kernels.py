"""How the model's large dots run on this backend: one static kernel policy, chosen at the engine.

The model (models/gemma.py) runs every large dot through a `gemma.Kernels` hook and knows nothing of
backends or cores. The engine builds a `KernelPolicy` once, from the backend and the process's cores,
and puts it into the frozen model config, so it is part of every jit cache key: a different policy
traces a different graph, never a stale one.

What the policy changes, and why:
- A one-row matmul (a decode step at batch 1) runs on one XLA:CPU thread, but XLA spreads a batched
  matmul over its threads. So on CPU a single row goes as one matmul batched over slices of the
  contraction (as many as the cores divide), summed after; the weight is only viewed, not copied.
- The GeGLU's two input weights [2, D, F] run as one dot batched over the pair: slicing them, or a dot
  contracting their middle dim, would copy the weights on every call.
- Attention (`attention_impl`): "blocks" keeps the prefix cache and the new tokens as two key blocks with one
  softmax over both (`gemma.block_attention`; what guided denoising's vjp needs on CPU, where the
  concatenation's slices and pads cost more than the attention); "concat" is openpi's one buffer and one
  softmax (`gemma.concat_attention`), fewer and larger kernels on GPU; "cudnn" runs that buffer through
  `jax.nn.dot_product_attention(implementation="cudnn")` (GPU only, half precision).
- The batched decode step is a chain of small-M GEMMs, which XLA:CPU runs faster with Eigen's GEMM than
  with its default YNNPACK dots; the option is experimental, so it is used only where this XLA has it.
"""

import dataclasses
import functools
import math
import os
from collections.abc import Sequence

import jax
import jax.numpy as jnp

from oxygen_jax.models import gemma

_EIGEN_DOTS = (("xla_cpu_experimental_ynn_fusion_type", ""),)

CompilerOptions = tuple[tuple[str, str | bool | int], ...]

# XLA:GPU options for the hot programs, to A/B on a GPU (not on by default: unmeasured). All three are
# per-compile DebugOptions (jit's `compiler_options`), not process-wide XLA_FLAGS: command buffers (CUDA
# graphs) over fusions, library calls and the decode / denoise loops, from graphs of one kernel on, so a
# program is about one launch; and the latency-hiding scheduler. Switch with
# `dataclasses.replace(policy, compiler_options=GPU_COMPILER_OPTIONS)`.
GPU_COMPILER_OPTIONS: CompilerOptions = (
    ("xla_gpu_enable_command_buffer", "FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,WHILE,CONDITIONAL"),
    ("xla_gpu_graph_min_graph_size", 1),
    ("xla_gpu_enable_latency_hiding_scheduler", True),
)


@dataclasses.dataclass(frozen=True)
class KernelPolicy:
    """Static execution choices for one backend (implements `gemma.Kernels`).

    matvec_split: cores a one-row matmul's contraction is spread over (1: a plain dot);
    decode_options: XLA compiler options for the batched decode step (pairs, so the policy hashes);
    compiler_options: XLA compiler options for every hot program (prefill, act, denoise, decode), e.g.
    `GPU_COMPILER_OPTIONS`;
    unroll_loops: the flow loop fully unrolled (one straight program, no loop at all), else a loop of
    compile-time length (`pi05.integrate_flow`);
    attention_impl: "blocks", "concat" or "cudnn", how `attention` runs (see the module docstring; not
    named `attention`, which is the `gemma.Kernels` method).
    """

    matvec_split: int = 1
    decode_options: CompilerOptions = ()
    compiler_options: CompilerOptions = ()
    unroll_loops: bool = False
    attention_impl: str = "concat"

    def __post_init__(self):
        if self.attention_impl not in _ATTENTION:
            raise ValueError(
                f"attention_impl must be one of {sorted(_ATTENTION)}, got {self.attention_impl!r}"
            )

    def _parts(self, rows: int, k: int) -> int:
        return math.gcd(k, self.matvec_split) if rows == 1 else 1

    def matmul(self, x: jax.Array, w: jax.Array) -> jax.Array:
        """x [..., K] @ w [K, N]."""
        parts = self._parts(math.prod(x.shape[:-1]), w.shape[0])
        if parts == 1:
            return jnp.dot(x, w)
        k, n = w.shape
        y = jnp.einsum("CBK,CKN->CBN", x.reshape(parts, 1, k // parts), w.reshape(parts, k // parts, n))
        return jnp.sum(y, axis=0).reshape(*x.shape[:-1], n)

    def gating(self, x: jax.Array, w: jax.Array) -> jax.Array:
        """x [..., D] against both of w [2, D, F] -> [2, ..., F], as one dot batched over the pair."""
        return jnp.einsum("C...D,CDF->C...F", jnp.broadcast_to(x, (2, *x.shape)), w)

    def tied_logits(self, hidden: jax.Array, table: jax.Array) -> jax.Array:
        """hidden [..., D] against the embedding table [V, D] -> float32 logits [..., V]."""
        vocab, width = table.shape
        parts = self._parts(math.prod(hidden.shape[:-1]), vocab)
        if parts == 1:
            return jnp.einsum("...D,VD->...V", hidden, table, preferred_element_type=jnp.float32)
        # One row: batched over slices of the vocabulary, so it runs on every core.
        row = jnp.broadcast_to(hidden.reshape(1, 1, width), (parts, 1, width))
        logits = jnp.einsum(
            "CBD,CVD->CBV", row, table.reshape(parts, -1, width), preferred_element_type=jnp.float32
        )
        return logits.reshape(*hidden.shape[:-1], vocab)

    def attention(
        self, q: jax.Array, k_blocks: Sequence[jax.Array], v_blocks: Sequence[jax.Array], mask: jax.Array
    ) -> jax.Array:
        """`gemma.Kernels.attention` by the policy's `attention_impl`."""
        return _ATTENTION[self.attention_impl](q, k_blocks, v_blocks, mask)


def cudnn_attention(
    q: jax.Array, k_blocks: Sequence[jax.Array], v_blocks: Sequence[jax.Array], mask: jax.Array
) -> jax.Array:
    """`gemma.Kernels.attention` by cuDNN's fused attention over the concatenated blocks. The mask goes in
    as an additive bias of `gemma.MASKED_LOGIT` (as a boolean mask cuDNN would fill -inf, and a fully
    masked row would not average the values as openpi's does); q is already scaled."""
    k, v = (
        jnp.concatenate(blocks, axis=1) if len(blocks) > 1 else blocks[0] for blocks in (k_blocks, v_blocks)
    )
    bias = jnp.where(mask, 0.0, gemma.MASKED_LOGIT).astype(q.dtype)[:, None]
    return jax.nn.dot_product_attention(q, k, v, bias=bias, scale=1.0, implementation="cudnn")


_ATTENTION = {"blocks": gemma.block_attention, "concat": gemma.concat_attention, "cudnn": cudnn_attention}


def _cpu_threads() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _supported(options: CompilerOptions) -> CompilerOptions:
    """`options` if this XLA compiles with them, else none."""
    try:
        jax.jit(jnp.dot, compiler_options=dict(options)).lower(jnp.ones((2, 2)), jnp.ones((2, 2))).compile()
    except RuntimeError:  # XLA's error for an unknown option
        return ()
    return options


@functools.cache
def for_backend(backend: str | None = None) -> KernelPolicy:
    """The policy for `backend` (default: JAX's default backend) on this process's cores."""
    if (backend or jax.default_backend()) != "cpu":
        return KernelPolicy()
    return KernelPolicy(
        matvec_split=_cpu_threads(), decode_options=_supported(_EIGEN_DOTS), attention_impl="blocks"
    )
