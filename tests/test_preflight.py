"""A tool checks what it can in well under a second before it loads a model, and says what is wrong in one
line (under ~200 characters) plus one line saying what to do."""

import os
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
from conftest import GOLDEN, SERVE, TOKENIZER, free_port

from oxygen_jax import config, preflight

MAX_LINE = 200


def _short(error: preflight.PreflightError) -> None:
    assert "\n" not in str(error) and len(str(error)) < MAX_LINE, str(error)
    assert "\n" not in error.hint and len(error.hint) < MAX_LINE, error.hint


@pytest.fixture
def empty_openpi_cache(tmp_path, monkeypatch):
    """openpi's cache and home both empty: no tokenizer and no checkpoint anywhere."""
    monkeypatch.setenv("OPENPI_DATA_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return tmp_path


def test_a_missing_tokenizer_is_named_in_one_short_line(empty_openpi_cache):
    with pytest.raises(preflight.PreflightError, match="no PaliGemma tokenizer at") as error:
        preflight.tokenizer_file(None)
    assert str(empty_openpi_cache / "cache") in str(error.value)
    assert "--tokenizer_path" in error.value.hint
    _short(error.value)


def test_existing_tokenizers_pass(empty_openpi_cache):
    preflight.tokenizer_file(TOKENIZER)
    preflight.tokenizer_file("standin")


def test_a_missing_checkpoint_is_named_in_one_short_line(empty_openpi_cache):
    with pytest.raises(preflight.PreflightError, match="no checkpoint at 'nowhere'") as error:
        preflight.checkpoint("nowhere")
    _short(error.value)


def test_checkpoints_that_exist_pass_and_none_is_random_init():
    preflight.checkpoint(str(GOLDEN / "checkpoint"))
    preflight.checkpoint(None)
    # The demo config's own checkpoint, shipped in the package, and its stand-in tokenizer.
    preflight.model(config.load_config("pi05_demo"), None, None)


def test_a_url_without_its_backend_names_the_extra(empty_openpi_cache, monkeypatch):
    monkeypatch.setitem(sys.modules, "gcsfs", None)
    with pytest.raises(preflight.PreflightError, match="needs the gcsfs package") as error:
        preflight.checkpoint("gs://openpi-assets/checkpoints/pi05_libero")
    assert error.value.hint == 'install it: pip install "oxygen_jax[gcs]"'


def test_a_missing_extra_is_named(monkeypatch):
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    with pytest.raises(preflight.PreflightError, match="reading datasets needs the pyarrow package") as error:
        preflight.extra("pyarrow", "train", "reading datasets")
    assert "oxygen_jax[train]" in error.value.hint
    preflight.extra("numpy", "core", "anything")  # installed: no error


def test_a_port_in_use_is_found():
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(preflight.PreflightError, match=f"cannot listen on 127.0.0.1:{port}") as error:
            preflight.port_free("127.0.0.1", port)
    _short(error.value)
    preflight.port_free("127.0.0.1", port)  # released: free again


def test_outputs_must_be_creatable(tmp_path):
    preflight.writable(str(tmp_path / "new" / "deeper" / "out.json"), folder=False)
    preflight.writable(str(tmp_path / "new_folder"), folder=True)
    (tmp_path / "file").write_text("")
    with pytest.raises(preflight.PreflightError, match="exists and is not a folder"):
        preflight.writable(str(tmp_path / "file"), folder=True)
    with pytest.raises(preflight.PreflightError, match="is not a writable folder"):
        preflight.writable(str(tmp_path / "file" / "below.json"), folder=False)


def test_numpy_inputs_must_exist_and_be_numpy_files(tmp_path):
    np.savez(tmp_path / "arrays.npz", a=np.zeros(2))
    np.save(tmp_path / "array.npy", np.zeros(2))
    (tmp_path / "notes.npz").write_text("not numpy")
    for good in ("arrays.npz", "array.npy"):
        preflight.numpy_file(str(tmp_path / good), "obs")
    preflight.numpy_file(None, "obs")  # not given: nothing to check
    with pytest.raises(preflight.PreflightError, match="--obs: no file at") as error:
        preflight.numpy_file(str(tmp_path / "absent.npz"), "obs")
    _short(error.value)
    with pytest.raises(preflight.PreflightError, match="--obs: no file at"):
        preflight.numpy_file(str(tmp_path), "obs")
    with pytest.raises(preflight.PreflightError, match=r"--rtc: .* is not a numpy file") as error:
        preflight.numpy_file(str(tmp_path / "notes.npz"), "rtc")
    _short(error.value)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_a_read_only_folder_is_refused(tmp_path):
    (tmp_path / "ro").mkdir(mode=0o500)
    with pytest.raises(preflight.PreflightError, match="is not a writable folder"):
        preflight.writable(str(tmp_path / "ro" / "out"), folder=True)


@pytest.mark.timeout(120)
def test_serve_without_a_tokenizer_fails_in_seconds_with_one_line(tmp_path):
    """`serve.py --env=ALOHA_SIM` (full-size pi0.5, minutes to initialize on a CPU) stops before the model:
    the wall time bounds "did not load it" generously for a busy 2-core machine (the check itself takes
    milliseconds)."""
    env = {**os.environ, "OPENPI_DATA_HOME": str(tmp_path / "cache"), "HOME": str(tmp_path / "home")}
    command = [sys.executable, str(SERVE), "--env=ALOHA_SIM", f"--port={free_port()}"]
    start = time.monotonic()
    run = subprocess.run(command, capture_output=True, text=True, timeout=110, env=env, check=False)
    seconds = time.monotonic() - start
    assert run.returncode == 2, run.stderr[-3000:]
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 2, run.stderr
    error, fix = lines
    assert error.startswith("error: no PaliGemma tokenizer at ") and str(tmp_path / "cache") in error
    assert len(error) < MAX_LINE, error
    assert fix.startswith("  fix: pass --tokenizer_path=") and len(fix) < MAX_LINE + 20, fix
    assert seconds < 20, seconds
