"""Which XLA:CPU dot kernels an entry point compiles with.

XLA:CPU hands dots to YNNPACK by default. The batched decode step is a chain of small-M GEMMs
(M = the batch state's slots), where Eigen's GEMM runs the step 9-16 % faster at 4-6 slots and no
slower at one, while YNNPACK stays the faster choice for prefill and denoising (measured in
BENCHMARKS.md). The option is experimental in XLA, so it is used only where the installed XLA has it.
"""

import functools

import jax
import jax.numpy as jnp

_EIGEN_DOTS = {"xla_cpu_experimental_ynn_fusion_type": ""}


@functools.cache
def small_gemm_options() -> dict[str, str]:
    """Compiler options for executables made of small-M GEMMs: Eigen's dots on CPU, XLA's defaults
    elsewhere or where this XLA does not know the option."""
    if jax.default_backend() != "cpu":
        return {}
    try:
        jax.jit(jnp.dot, compiler_options=_EIGEN_DOTS).lower(jnp.ones((2, 2)), jnp.ones((2, 2))).compile()
    except RuntimeError:  # XLA's error for an unknown option
        return {}
    return _EIGEN_DOTS
