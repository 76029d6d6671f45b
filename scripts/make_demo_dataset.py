"""`oxygen-make-demo-dataset` from a checkout: the tool lives in `oxygen_jax.tools.make_demo_dataset`."""

from oxygen_jax.tools import make_demo_dataset

if __name__ == "__main__":
    make_demo_dataset.run()
