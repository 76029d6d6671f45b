"""`oxygen-eval-droid` from a checkout: the tool lives in `oxygen_jax.tools.eval_droid`."""

from oxygen_jax.tools import eval_droid

if __name__ == "__main__":
    eval_droid.run()
