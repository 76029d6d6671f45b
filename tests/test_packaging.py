"""The project as a user installs it: a built wheel (not the checkout) finds its configs by name, and
neither the wheel nor the sdist carries the tests' reference data."""

import hashlib
import os
import pathlib
import shutil
import subprocess
import sys
import tarfile
import zipfile

import pytest
from conftest import GOLDEN, project_copy

from oxygen_jax import config

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> pathlib.Path:
    """What the wheel is made of, with the golden set beside it as in the checkout."""
    project = project_copy(tmp_path_factory.mktemp("project") / "oxygen_jax")
    shutil.copytree(GOLDEN, project / "tests" / "golden")
    return project


@pytest.fixture(scope="module")
def wheel(project, tmp_path_factory) -> pathlib.Path:
    """The wheel built from this checkout."""
    dist = tmp_path_factory.mktemp("dist")
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(project)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert build.returncode == 0, build.stderr
    (wheel,) = dist.glob("oxygen_jax-*.whl")
    return wheel


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> pathlib.Path:
    """The wheel installed (without dependencies) into a fresh folder."""
    site = tmp_path_factory.mktemp("site")
    install = [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(wheel)]
    subprocess.run(install, capture_output=True, text=True, timeout=600, check=True)
    return site


def test_installed_wheel_loads_a_config_by_name(installed, tmp_path):
    code = (
        "import oxygen_jax, oxygen_jax.config as c; cfg = c.load_config('pi05_tiny'); "
        "print(oxygen_jax.__file__); print(cfg.name, cfg.model.action_horizon, c.known_configs())"
    )
    # The wheel's folder first on the path, run away from the checkout: nothing is read from src/.
    env = {**os.environ, "PYTHONPATH": str(installed)}
    run = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, check=False
    )
    assert run.returncode == 0, run.stderr
    package_file, loaded = run.stdout.splitlines()
    assert pathlib.Path(package_file).is_relative_to(installed)
    assert loaded.startswith("pi05_tiny 10 [")
    names = ("pi05", "pi05_aloha", "pi05_aloha_sim", "pi05_cpu", "pi05_droid", "pi05_libero", "pi05_tiny")
    for name in names:
        assert repr(name) in loaded


def test_installed_wheel_carries_every_shipped_checkpoint(installed):
    """Every config whose checkpoint ships in the package finds all of its files in the wheel."""
    package = pathlib.Path(config.__file__).parent
    shipped = [c.checkpoint_dir for c in map(config.load_config, config.known_configs()) if c.checkpoint_dir]
    assert {pathlib.Path(d).name for d in shipped} >= {
        "pi05_demo",
        "pi05_detour",
        "pi05_detour_wide",
        "pi05_detour_prefix",
    }
    for checkpoint in map(pathlib.Path, shipped):
        files = sorted(p.relative_to(package) for p in checkpoint.rglob("*") if p.is_file())
        assert files, checkpoint
        assert all((installed / "oxygen_jax" / f).is_file() for f in files), checkpoint


def test_installed_wheel_declares_apache_2_and_carries_the_license(installed):
    (dist_info,) = installed.glob("oxygen_jax-*.dist-info")
    assert "License-Expression: Apache-2.0" in (dist_info / "METADATA").read_text().splitlines()
    license_text = (dist_info / "licenses" / "LICENSE").read_text()
    assert license_text == (ROOT / "LICENSE").read_text()
    assert "Apache License" in license_text and "Version 2.0" in license_text


def _golden_members(members: dict[str, bytes]) -> list[str]:
    """The archive members under a tests/ folder or holding a golden file's bytes, whatever their name (files
    of 1 KiB or more: smaller orbax index nodes are the same in every checkpoint)."""
    files = [p for p in GOLDEN.rglob("*") if p.is_file() and p.stat().st_size >= 1024]
    golden = {hashlib.sha256(p.read_bytes()).digest() for p in files}
    return [n for n, data in members.items() if "tests/" in n or hashlib.sha256(data).digest() in golden]


def test_wheel_carries_no_golden_file(wheel):
    with zipfile.ZipFile(wheel) as archive:
        members = {n: archive.read(n) for n in archive.namelist()}
    assert "oxygen_jax/__init__.py" in members
    assert _golden_members(members) == []


def test_sdist_carries_no_golden_file(project, tmp_path):
    """The sdist made by the build backend pyproject.toml names, as a build frontend would."""
    backend = tmp_path / "backend"
    fetch = [sys.executable, "-m", "pip", "install", "-q", "--target", str(backend), "setuptools>=77"]
    subprocess.run(fetch, capture_output=True, text=True, timeout=600, check=True)
    code = f"from setuptools import build_meta; print(build_meta.build_sdist({str(tmp_path)!r}))"
    build = subprocess.run(
        [sys.executable, "-c", code],
        cwd=project,
        env={**os.environ, "PYTHONPATH": str(backend)},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert build.returncode == 0, build.stderr
    with tarfile.open(tmp_path / build.stdout.split()[-1]) as archive:
        members = {m.name: archive.extractfile(m).read() for m in archive.getmembers() if m.isfile()}
    assert any(n.endswith("src/oxygen_jax/__init__.py") for n in members)
    assert _golden_members(members) == []
