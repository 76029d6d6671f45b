"""pyarrow, the one package LeRobot's parquet files need: an optional extra, imported only when a dataset is
read or written, so the tools that never touch one run without it."""

from types import ModuleType

from oxygen_jax.errors import UserError

INSTALL = "pip install 'oxygen_jax[train]'"


class MissingPyarrowError(UserError, ImportError):
    """pyarrow is not installed; the message names the extra that brings it."""


def parquet() -> tuple[ModuleType, ModuleType]:
    """`pyarrow` and `pyarrow.parquet`, or a one-line error naming the install command."""
    try:
        import pyarrow
        import pyarrow.parquet
    except ImportError as error:
        raise MissingPyarrowError(
            f"LeRobot datasets are parquet files, read and written with pyarrow ({error}); "
            f"install it with: {INSTALL}"
        ) from error
    return pyarrow, pyarrow.parquet
