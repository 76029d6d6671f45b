"""`oxygen-eval-libero` from a checkout: the tool lives in `oxygen_jax.tools.eval_libero`."""

from oxygen_jax.tools import eval_libero

if __name__ == "__main__":
    eval_libero.run()
