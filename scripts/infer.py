"""`oxygen-infer` from a checkout: the tool lives in `oxygen_jax.tools.infer`."""

from oxygen_jax.tools import infer

if __name__ == "__main__":
    infer.run()
