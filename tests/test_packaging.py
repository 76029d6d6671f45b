"""The project as a user installs it: a built wheel (not the checkout) finds its configs by name."""

import os
import pathlib
import subprocess
import sys

import pytest
from conftest import project_copy

from oxygen_jax import config

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> pathlib.Path:
    """The wheel built from this checkout, installed (without dependencies) into a fresh folder."""
    tmp = tmp_path_factory.mktemp("wheel")
    project = project_copy(tmp / "project")
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp / "dist"), str(project)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert build.returncode == 0, build.stderr
    (wheel,) = (tmp / "dist").glob("oxygen_jax-*.whl")
    site = tmp / "site"
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
