"""`oxygen-benchmark` from a checkout: the tool lives in `oxygen_jax.tools.benchmark`."""

from oxygen_jax.tools import benchmark

if __name__ == "__main__":
    benchmark.run()
