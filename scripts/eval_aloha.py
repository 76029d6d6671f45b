"""`oxygen-eval-aloha` from a checkout: the tool lives in `oxygen_jax.tools.eval_aloha`."""

from oxygen_jax.tools import eval_aloha

if __name__ == "__main__":
    eval_aloha.run()
