"""`oxygen-run` from a checkout: the tool lives in `oxygen_jax.tools.run`."""

from oxygen_jax.tools import run

if __name__ == "__main__":
    run.run()
