"""`oxygen-eval-table` from a checkout: the tool lives in `oxygen_jax.tools.eval_table`."""

from oxygen_jax.tools import eval_table

if __name__ == "__main__":
    eval_table.run()
