"""Errors that mean the user asked for something that cannot work (a name, a path, a value).

Their message is one line that names the problem and the fix; command-line tools print it instead of a
traceback (`cli.run`). Each also derives from the builtin error that library callers already expect.
"""


def install_hint(extra: str) -> str:
    """How a user installs one of the package's extras (from the registry, the repository or a checkout,
    README's Install section says how the name is written there)."""
    return f'pip install "oxygen_jax[{extra}]"'


class UserError(Exception):
    """A mistake in what was asked, not a bug: reported in one line."""


class ConfigError(UserError, ValueError):
    """An unknown config name or a config value the model cannot use."""


class MissingFileError(UserError, FileNotFoundError):
    """A file or folder the user pointed at (or the default place for one) does not exist."""


class CheckpointError(MissingFileError):
    """No checkpoint (or no norm stats in it) where the user pointed."""


class InvalidArgumentError(UserError, ValueError):
    """A path, URL or value the user gave that cannot be used as it is (the message says what would)."""


class UnreachableError(UserError, OSError):
    """A remote location the user named cannot be reached (offline, DNS, permissions)."""


class InvalidRequest(UserError, ValueError):  # noqa: N818 (a request, not an error, is what is invalid)
    """A served request the policy refuses (a missing key, a bad option): the client's fault, answered in
    one line. Anything else raised while serving is a server fault."""
