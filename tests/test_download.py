"""Remote checkpoints downloaded into openpi's cache layout, on fsspec's in-memory filesystem."""

import importlib.util
import uuid

import fsspec
import jax
import numpy as np
import pytest
from conftest import GOLDEN

from oxygen_jax import download
from oxygen_jax.checkpoints import norm_stats_path, resolve_checkpoint_dir, restore_params

LIBERO = "physical-intelligence/libero"


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENPI_DATA_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def remote():
    """The golden checkpoint at memory://<fresh bucket>/checkpoints/pi05_tiny; the bucket is removed after."""
    memory = fsspec.filesystem("memory")
    bucket = f"bucket-{uuid.uuid4().hex[:8]}"
    memory.put(str(GOLDEN / "checkpoint"), f"/{bucket}/checkpoints/pi05_tiny", recursive=True)
    yield f"memory://{bucket}/checkpoints/pi05_tiny"
    memory.rm(f"/{bucket}", recursive=True)


def test_url_lands_where_openpi_puts_it_and_restores_bit_exact(cache, remote, golden_params):
    bucket_path = remote.removeprefix("memory://")
    local = resolve_checkpoint_dir(remote)
    assert local == (cache / bucket_path).resolve()
    restored = restore_params(remote)
    jax.tree.map(np.testing.assert_array_equal, restored, golden_params)
    assert norm_stats_path(remote, LIBERO) == local / "assets" / LIBERO / "norm_stats.json"
    assert [p.name for p in local.parent.iterdir()] == ["pi05_tiny"]  # no scratch folder left behind


def test_cached_copy_is_used_without_the_remote(cache, remote):
    local = download.maybe_download(remote)
    fsspec.filesystem("memory").rm(remote.removeprefix("memory:/"), recursive=True)
    assert download.maybe_download(remote) == local
    assert resolve_checkpoint_dir(remote) == local.resolve()


def test_download_shows_a_bar_over_the_bytes(cache, remote, capsys):
    total = fsspec.filesystem("memory").du(remote.removeprefix("memory:/"))
    download.maybe_download(remote)
    bar = capsys.readouterr().err.replace("\r", "\n").splitlines()[-1]
    assert bar.startswith("pi05_tiny: 100%")
    assert f"{total / 2**20:.2f}M" in bar


def test_single_file_url(cache, remote):
    url = f"{remote}/assets/{LIBERO}/norm_stats.json"
    local = download.maybe_download(url)
    assert local.read_bytes() == (GOLDEN / "checkpoint" / "assets" / LIBERO / "norm_stats.json").read_bytes()


def test_missing_remote_is_named_and_leaves_the_cache_empty(cache, remote):
    with pytest.raises(FileNotFoundError, match=r"memory://.*/pi05_nope does not exist"):
        resolve_checkpoint_dir(remote.replace("pi05_tiny", "pi05_nope"))
    assert not (cache / remote.removeprefix("memory://")).parent.exists()


def test_unknown_scheme_is_a_one_line_error(cache):
    with pytest.raises(ValueError, match=r"cannot read nosuch://bucket/x: .*install") as error:
        download.maybe_download("nosuch://bucket/x")
    assert "\n" not in str(error.value)


@pytest.mark.skipif(importlib.util.find_spec("gcsfs") is not None, reason="gcsfs is installed")
def test_gs_without_gcsfs_names_the_extra(cache):
    with pytest.raises(ValueError, match=r"install gcsfs: pip install \"oxygen_jax\[gcs\]\"") as error:
        download.maybe_download("gs://openpi-assets/checkpoints/pi05_libero")
    assert "\n" not in str(error.value)


def test_cached_gs_checkpoint_needs_no_network(cache):
    """A copy openpi already downloaded is found under the same layout, without gcsfs or a network."""
    cached = cache / "openpi-assets" / "checkpoints" / "pi05_libero"
    (cached / "params").mkdir(parents=True)
    (cached / "params" / "_METADATA").write_text("{}")
    assert resolve_checkpoint_dir("gs://openpi-assets/checkpoints/pi05_libero") == cached.resolve()


def test_pytorch_checkpoint_is_named_with_what_to_do(tmp_path):
    checkpoint = tmp_path / "pi05_libero_pytorch"
    (checkpoint / "assets").mkdir(parents=True)
    (checkpoint / "model.safetensors").write_bytes(b"")
    with pytest.raises(ValueError, match="openpi PyTorch checkpoint") as error:
        resolve_checkpoint_dir(checkpoint)
    message = str(error.value)
    assert "\n" not in message
    assert "params/" in message and "gs://openpi-assets/checkpoints/pi05_libero_pytorch" in message
