"""Checks a tool runs in well under a second before it loads or initializes a model: the tokenizer file,
the checkpoint, the optional packages its flags need, a free port, a writable output. A full-size pi0.5
takes minutes to initialize on a CPU; a missing file must not be found after that.

Each check raises `PreflightError`: one line (under ~200 characters) saying what is wrong, and `hint`,
one line saying what to do; `cli.run` prints both.
"""

import importlib.util
import os
import pathlib
import socket
import sys
import urllib.parse

from oxygen_jax import checkpoints, config, download, tokenizer
from oxygen_jax.errors import MissingFileError, UserError, install_hint

# The fsspec backend each URL scheme needs, and the extra that installs it.
_URL_BACKENDS = {"gs": ("gcsfs", "gcs")}


class PreflightError(UserError):
    """What a tool found missing before its slow start; `hint` says what to do (one line each)."""

    def __init__(self, message: str, hint: str) -> None:
        super().__init__(message)
        self.hint = hint


def _installed(module: str) -> bool:
    """Whether `module` can be imported, found without importing it (a None in sys.modules: blocked)."""
    if module in sys.modules:
        return sys.modules[module] is not None
    return importlib.util.find_spec(module) is not None


def extra(module: str, extra_name: str, purpose: str) -> None:
    """`module` is importable, else the extra that brings it."""
    if not _installed(module):
        raise PreflightError(
            f"{purpose} needs the {module} package", f"install it: {install_hint(extra_name)}"
        )


def _url(url: str, what: str) -> None:
    """A URL is readable later: its copy is in openpi's cache, or its scheme's backend is installed."""
    if download.cache_path(url).exists():
        return
    scheme = urllib.parse.urlparse(url).scheme
    if scheme in _URL_BACKENDS:
        module, extra_name = _URL_BACKENDS[scheme]
        extra(module, extra_name, f"downloading the {what} {url}")


def tokenizer_file(path: str | None) -> None:
    """The tokenizer a config or `--tokenizer_path` names exists (a URL: it can be downloaded)."""
    if path is not None and download.is_url(path):
        _url(path, "tokenizer")
        return
    try:
        tokenizer.resolve_tokenizer_path(path)
    except MissingFileError:
        where = path or str(download.cache_dir() / "big_vision" / "paligemma_tokenizer.model")
        raise PreflightError(
            f"no PaliGemma tokenizer at {where}",
            f"pass --tokenizer_path=FILE, or --tokenizer_path={tokenizer.TOKENIZER_URL} to download it "
            f"({install_hint('gcs')}); vocab-1024 configs: --tokenizer_path={tokenizer.STANDIN}",
        ) from None


def checkpoint(path: str | None) -> None:
    """The checkpoint a tool will load is there (None: random init, nothing to check)."""
    if path is None:
        return
    if download.is_url(path):
        _url(path, "checkpoint")
        return
    try:
        checkpoints.resolve_checkpoint_dir(path)
    except MissingFileError:
        raise PreflightError(
            f"no checkpoint at {path!r} (neither a folder with params/ nor a name in openpi's cache "
            f"{download.cache_dir()})",
            "pass a checkpoint folder, an openpi cache name (pi05_libero) or "
            "gs://openpi-assets/checkpoints/<name> (docs/checkpoints.md)",
        ) from None


def model(
    cfg, checkpoint_dir: str | None, tokenizer_path: str | None, *, needs_tokenizer: bool = True
) -> None:
    """What loading `cfg`'s model reads from disk: its checkpoint (the config's own when none is given)
    and, for a tool that makes or reads text, its tokenizer."""
    checkpoint(config.checkpoint_for(cfg, checkpoint_dir))
    if needs_tokenizer:
        tokenizer_file(tokenizer_path or cfg.tokenizer_path)


def port_free(host: str, port: int) -> None:
    """Nothing else listens on host:port (binding it now and releasing it at once)."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as error:
            raise PreflightError(
                f"cannot listen on {host}:{port}: {error.strerror or error}",
                "stop the program that holds the port, or pass --port=N",
            ) from None


def numpy_file(path: str | None, flag: str) -> None:
    """The file a flag names is there and is numpy's: an .npz archive (a zip) or an .npy array (its magic
    string), read from its first bytes only. None: the flag was not given."""
    if path is None:
        return
    target = pathlib.Path(path).expanduser()
    if not target.is_file():
        raise PreflightError(f"--{flag}: no file at {path}", "pass an existing .npz or .npy file")
    try:
        with open(target, "rb") as f:
            head = f.read(6)
    except OSError as error:
        raise PreflightError(
            f"--{flag}: cannot read {path}: {error.strerror or error}", "pass a readable file"
        ) from None
    if head[:4] != b"PK\x03\x04" and head != b"\x93NUMPY":
        raise PreflightError(
            f"--{flag}: {path} is not a numpy file (.npz or .npy)", "write it with np.savez or np.save"
        )


def writable(path: str, *, folder: bool) -> None:
    """The tool can create `path` (a folder when `folder`, else a file): its nearest existing ancestor
    is a writable folder, and the path itself is not the wrong kind of thing."""
    target = pathlib.Path(path).expanduser()
    if target.exists() and target.is_dir() != folder:
        kind = "a file" if target.is_dir() else "a folder"
        raise PreflightError(f"{path} exists and is not {kind}", "pass another path")
    existing = target if target.exists() else target.parent
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise PreflightError(f"cannot write {path}: {existing} is not a writable folder", "pass another path")
