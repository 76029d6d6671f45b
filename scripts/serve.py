"""`oxygen-serve` from a checkout: the tool lives in `oxygen_jax.tools.serve`."""

from oxygen_jax.tools import serve

if __name__ == "__main__":
    serve.run()
