"""Why an evaluation cannot start, said in one line. Simulator packages are optional extras, imported only
through `require`, which turns a missing one into an error naming the install command."""

import importlib
from typing import Any

from oxygen_jax.errors import UserError


class SetupError(UserError, RuntimeError):
    """The evaluation cannot start: CLIs report it in one line instead of a traceback."""


class MissingDependencyError(SetupError):
    """An optional package or system library that this evaluation needs is not installed."""


def require(module: str, *, install: str, purpose: str) -> Any:
    """Imports an optional dependency, or says how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise MissingDependencyError(
            f"{purpose} needs the `{module}` package ({error}); install it with: {install}"
        ) from error
