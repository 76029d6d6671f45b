"""matplotlib, the `plot` extra (pulled by the `train` and `benchmark` extras): imported only when a plot
is drawn, so inference and serving run without it, and a missing one is a one-line error naming the extra."""

from types import ModuleType

from oxygen_jax.errors import UserError, install_hint

INSTALL = install_hint("plot")


class MissingMatplotlibError(UserError, ImportError):
    """matplotlib is not installed; the message names the extra that brings it."""


def pyplot() -> ModuleType:
    """`matplotlib.pyplot` on the file-only Agg backend, or a one-line error naming the install command."""
    try:
        import matplotlib
    except ImportError as error:
        raise MissingMatplotlibError(
            f"plots are drawn with matplotlib ({error}); install it with: {INSTALL}"
        ) from error
    matplotlib.use("Agg")
    import matplotlib.pyplot

    return matplotlib.pyplot
