"""`oxygen-train` from a checkout: the tool lives in `oxygen_jax.tools.train`."""

from oxygen_jax.tools import train

if __name__ == "__main__":
    train.run()
