"""Remote checkpoints (`gs://...`, or any fsspec URL) copied into openpi's cache, where openpi puts them.

openpi's `download.maybe_download` keeps `<scheme>://<bucket>/<path>` at `<cache>/<bucket>/<path>`, with
`<cache>` = `$OPENPI_DATA_HOME` or `~/.cache/openpi`; a copy made by either project serves the other.
A copy is complete or absent: files land in a scratch folder beside the target and are renamed into place
at the end, so an interrupted download leaves nothing that looks like a checkpoint. `gs://` needs gcsfs
(`pip install "oxygen_jax[gcs]"`); openpi's buckets are public and read anonymously.
"""

import os
import pathlib
import shutil
import tempfile
import urllib.parse
from collections.abc import Mapping
from typing import Any

import fsspec
import tqdm
from fsspec.callbacks import Callback

from oxygen_jax.errors import InvalidArgumentError, MissingFileError, UnreachableError, install_hint

_CACHE_ENV = "OPENPI_DATA_HOME"
_DEFAULT_CACHE = "~/.cache/openpi"
# Storage options per scheme: public buckets need no credentials (and gcsfs would otherwise look for them).
_DEFAULT_OPTIONS: dict[str, dict[str, Any]] = {"gs": {"token": "anon"}}
_INSTALL = {"gs": f"install gcsfs: {install_hint('gcs')}"}


def cache_dir() -> pathlib.Path:
    """openpi's download cache (the same variable and default as openpi)."""
    return pathlib.Path(os.getenv(_CACHE_ENV, _DEFAULT_CACHE)).expanduser()


def is_url(text: str) -> bool:
    """`scheme://...` (a Windows drive letter such as `C:` is not a scheme)."""
    scheme = urllib.parse.urlparse(text).scheme
    return len(scheme) > 1 and "://" in text


def cache_path(url: str) -> pathlib.Path:
    """Where openpi keeps a copy of `url`: `<cache>/<bucket>/<path>`."""
    parsed = urllib.parse.urlparse(url)
    return cache_dir() / parsed.netloc / parsed.path.strip("/")


class _FileBytes(Callback):
    """One file's bytes, added to the shared bar."""

    def __init__(self, bar: tqdm.tqdm) -> None:
        super().__init__()
        self._bar = bar

    def relative_update(self, inc: int = 1) -> None:
        self._bar.update(inc)


class _BytesBar(Callback):
    """A progress bar over the bytes of every file that one recursive `get` copies."""

    def __init__(self, bar: tqdm.tqdm) -> None:
        super().__init__()
        self._bar = bar

    def branched(self, path_1: str, path_2: str, **kwargs: Any) -> Callback:
        return _FileBytes(self._bar)


def _filesystem(url: str, storage_options: Mapping[str, Any] | None) -> tuple[Any, str]:
    scheme = urllib.parse.urlparse(url).scheme
    options = _DEFAULT_OPTIONS.get(scheme, {}) if storage_options is None else dict(storage_options)
    try:
        return fsspec.core.url_to_fs(url, **options)
    except (ImportError, ValueError) as error:  # no backend for the scheme, or an unknown scheme
        install = _INSTALL.get(scheme, f"install the fsspec backend for {scheme}://")
        raise InvalidArgumentError(f"cannot read {url}: {error}; {install}") from error


def maybe_download(url: str, *, storage_options: Mapping[str, Any] | None = None) -> pathlib.Path:
    """The local copy of `url` (a file or a folder) in openpi's cache, downloaded first if absent."""
    local = cache_path(url)
    if local.exists():
        return local
    fs, path = _filesystem(url, storage_options)
    try:
        info = fs.info(path)
        is_dir = info["type"] == "directory"
        total = fs.du(path) if is_dir else info["size"]
    except FileNotFoundError as error:
        raise MissingFileError(f"{url} does not exist") from error
    except Exception as error:  # network, DNS or permission failures: the backend's own types
        raise UnreachableError(
            f"cannot reach {url} ({type(error).__name__}: {error}); offline? copy it by hand to {local}"
        ) from error
    local.parent.mkdir(parents=True, exist_ok=True)
    scratch = pathlib.Path(tempfile.mkdtemp(prefix=f"{local.name}.partial-", dir=local.parent))
    try:
        with tqdm.tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=local.name) as bar:
            fs.get(path, str(scratch / local.name), recursive=is_dir, callback=_BytesBar(bar))
        try:
            (scratch / local.name).rename(local)
        except OSError:
            if not local.exists():  # not another process finishing the same download first
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return local
