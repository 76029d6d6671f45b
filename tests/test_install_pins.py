"""Installs that work in any order: the simulator extras share one mujoco/dm-control pair, the constraints
file agrees with every declared requirement, and a mismatched pair is named before the simulator starts."""

import importlib.util
import json
import pathlib
import re
import subprocess
import sys
import tomllib
from importlib import metadata

import pytest
from conftest import project_copy
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from oxygen_jax.evaluation import mujoco_pair

ROOT = pathlib.Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
EXTRAS = PROJECT["optional-dependencies"]
SIM_PACKAGES = ("mujoco", "dm-control")


def pins(extra: str) -> dict[str, str]:
    """The extra's specifier for each simulator package."""
    requirements = [Requirement(text) for text in EXTRAS[extra]]
    return {r.name: str(r.specifier) for r in requirements if r.name in SIM_PACKAGES}


def constraints() -> dict[str, str]:
    lines = (ROOT / "constraints.txt").read_text().splitlines()
    pairs = [line.split("==") for line in lines if line and not line.startswith("#")]
    return {canonicalize_name(name): version for name, version in pairs}


def test_simulator_extras_pin_the_same_pair():
    assert set(pins("aloha")) == set(SIM_PACKAGES)
    assert pins("aloha") == pins("libero")
    assert set(EXTRAS["sim"]) == {"oxygen_jax[aloha,libero]"}


def test_the_fix_in_the_error_is_the_pinned_pair():
    named = [Requirement(text) for text in re.findall(r'"([^"]+)"', mujoco_pair.FIX)]
    assert {r.name: str(r.specifier) for r in named} == pins("aloha")


def test_constraints_satisfy_every_declared_requirement():
    pinned = constraints()
    declared = PROJECT["dependencies"] + [text for extra in EXTRAS.values() for text in extra]
    checked = 0
    for requirement in (Requirement(text) for text in declared):
        version = pinned.get(canonicalize_name(requirement.name))
        if version is not None:
            assert requirement.specifier.contains(version), f"constraints.txt {requirement.name}=={version}"
            checked += 1
    assert checked >= 20
    assert mujoco_pair.mismatch(pinned["dm-control"], ["mujoco>=3.3.6"], pinned["mujoco"]) is None


def test_mismatched_pair_is_one_line_naming_both_and_the_fix():
    # dm-control 1.0.41's declared requirements beside the mujoco the LIBERO extra allows.
    requires = ["absl-py>=0.7.0", "mujoco>=3.8.1", 'h5py; extra == "hdf5"']
    message = mujoco_pair.mismatch("1.0.41", requires, "3.3.7")
    assert message is not None and "\n" not in message
    assert message.startswith("dm-control 1.0.41 needs mujoco>=3.8.1 but mujoco 3.3.7 is installed")
    assert re.search(r"pip install .*dm-control.*mujoco", message)


def test_matching_pair_passes():
    assert mujoco_pair.mismatch("1.0.34", ["mujoco>=3.3.6", "numpy>=1.9.0"], "3.3.7") is None


@pytest.mark.skipif(importlib.util.find_spec("dm_control") is None, reason="no aloha extra installed")
def test_installed_pair_fits():
    assert mujoco_pair.installed_mismatch() is None
    installed = {name: metadata.version(name) for name in SIM_PACKAGES}
    for name, specifier in pins("aloha").items():
        assert Requirement(f"{name}{specifier}").specifier.contains(installed[name]), installed


def test_dockerfile_copies_existing_files_and_installs_known_extras():
    dockerfile = (ROOT / "Dockerfile").read_text()
    for line in dockerfile.splitlines():
        if line.startswith("COPY "):
            for source in line.split()[1:-1]:
                assert (ROOT / source).exists(), line
    (default,) = re.findall(r"^ARG EXTRAS=(\S+)$", dockerfile, re.MULTILINE)
    documented = re.findall(r"EXTRAS=(\S+)", dockerfile)
    for extras in documented:
        assert set(extras.split(",")) <= set(EXTRAS), extras
    assert default in EXTRAS
    assert 'pip install -c constraints.txt ".[${EXTRAS}]"' in dockerfile


@pytest.mark.slow
@pytest.mark.parametrize("extras", ["aloha", "libero", "aloha,libero"])
def test_resolver_picks_the_pinned_pair(extras, tmp_path):
    """pip's resolver (a dry run against the package index, as a fresh venv would install) picks the same
    mujoco/dm-control pair for each simulator extra and for both, so installs in any order agree."""
    project = project_copy(tmp_path / "project")
    report = tmp_path / "report.json"
    command = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "-q"]
    command += ["--report", str(report), f"{project}[{extras}]"]
    run = subprocess.run(command, capture_output=True, text=True, timeout=900, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    chosen = {
        canonicalize_name(item["metadata"]["name"]): item["metadata"]["version"]
        for item in json.loads(report.read_text())["install"]
    }
    for name, specifier in pins("aloha").items():
        assert Requirement(f"{name}{specifier}").specifier.contains(chosen[name]), chosen
