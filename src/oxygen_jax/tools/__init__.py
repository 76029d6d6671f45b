"""The command-line tools (`oxygen-run`, `oxygen-serve`, ...): each module's `run()` is a console script,
and `python -m oxygen_jax.tools.<tool>` runs it too."""
