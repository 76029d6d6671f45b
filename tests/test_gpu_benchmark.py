"""scripts/gpu_benchmark.sh: the GPU run as the lent machine's image runs it, checked without a GPU.

`--dry-run` proves that the image's package list plus the carried wheels cover every distribution the
benchmark imports; `--smoke` runs the GPU path on CPU with pi05_tiny (carried wheels installed without an
index, stages under the time budget, the summary) and the tests check what would come back.
"""

import base64
import dataclasses
import hashlib
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import zipfile

import pytest
import yaml
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

import oxygen_jax
from oxygen_jax.benchmarks import gpu_image, gpu_summary

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_benchmark.sh"


def _run(
    *args: str, env: dict[str, str], timeout: float = 120, script: pathlib.Path = SCRIPT
) -> subprocess.CompletedProcess:
    environ = {**os.environ, "PYTHON": sys.executable, **env}
    return subprocess.run(
        ["bash", str(script), *args],
        env=environ,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _gpu_wheels_names() -> dict[str, str]:
    """Distribution -> version of each wheel scripts/gpu_wheels.sh downloads."""
    text = (ROOT / "scripts" / "gpu_wheels.sh").read_text()
    entries = re.search(r"^WHEELS=\((.*)\)$", text, re.MULTILINE).group(1).split()
    return dict(entry.split("==") for entry in entries)


def _wheel(folder: pathlib.Path, name: str, version: str, files: dict[str, str]) -> pathlib.Path:
    """A pure-Python wheel of `files` (path -> text) with the metadata and RECORD pip installs from."""
    dist_info = f"{name}-{version}.dist-info"
    files = {
        **files,
        f"{dist_info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{dist_info}/WHEEL": "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = ""
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record += f"{path},sha256={digest},{len(text.encode())}\n"
    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for path, text in files.items():
            archive.writestr(path, text)
        archive.writestr(f"{dist_info}/RECORD", record + f"{dist_info}/RECORD,,\n")
    return wheel


def test_dry_run_names_exactly_what_gpu_wheels_downloads_as_missing(tmp_path):
    run = _run("--dry-run", env={"WHEELS_DIR": str(tmp_path)})
    lines = run.stdout.splitlines()
    assert run.returncode == 1 and lines[-1] == "not ready", run.stdout + run.stderr
    missing = {line.split()[1] for line in lines if line.startswith("missing:")}
    assert missing == {canonicalize_name(name) for name in _gpu_wheels_names()}


def test_dry_run_is_ready_with_a_wheel_of_each_missing_distribution(tmp_path):
    """The check matches wheels by file name and tags: a stand-in wheel of each distribution gpu_wheels.sh
    downloads, at its version, makes the image cover every import."""
    for name, version in _gpu_wheels_names().items():
        _wheel(tmp_path, name, version, {})
    run = _run("--dry-run", env={"WHEELS_DIR": str(tmp_path)})
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.splitlines()[-1] == "ready"


def test_imports_map_to_the_distributions_that_installed_them():
    modules = {"yaml": yaml, "json": json, "oxygen_jax": oxygen_jax}
    assert gpu_image.imported_distributions(modules, ROOT) == ({"pyyaml": {"yaml"}}, set())


def test_a_distribution_installed_inside_the_checkout_still_counts():
    """CI's virtual env lives in the checkout (.venv): a checkout root above both site-packages and src/
    must skip only the checkout's own modules, not what a distribution installed there."""
    checkout = pathlib.Path(os.path.commonpath([yaml.__file__, oxygen_jax.__file__]))
    modules = {"yaml": yaml, "json": json, "oxygen_jax": oxygen_jax}
    assert gpu_image.imported_distributions(modules, checkout) == ({"pyyaml": {"yaml"}}, set())


@pytest.fixture
def ci_checkout(tmp_path):
    """What the dry run needs of the checkout, copied, with this interpreter's virtual env at .venv inside
    it as .ci/run makes it (a link: the env's paths are then under the copy)."""
    if sys.prefix == sys.base_prefix:
        pytest.skip("the tests' interpreter is not in a virtual env")
    checkout = tmp_path / "checkout"
    skip = shutil.ignore_patterns("__pycache__", "*.egg-info")
    for folder in ("scripts", "src"):
        shutil.copytree(ROOT / folder, checkout / folder, ignore=skip)
    for name in ("pyproject.toml", ".gitignore"):
        shutil.copy(ROOT / name, checkout / name)
    subprocess.run(["git", "init", "-q"], cwd=checkout, check=True)
    (checkout / ".venv").symlink_to(sys.prefix, target_is_directory=True)
    return checkout


def test_dry_run_with_the_virtual_env_inside_the_checkout_sees_every_import(ci_checkout, tmp_path):
    python = ci_checkout / ".venv" / "bin" / "python"
    env = {"PYTHON": str(python), "WHEELS_DIR": str(tmp_path / "none")}
    run = _run("--dry-run", env=env, script=ci_checkout / "scripts" / "gpu_benchmark.sh")
    lines = run.stdout.splitlines()
    assert run.returncode == 1 and lines[-1] == "not ready", run.stdout + run.stderr
    assert f"{python}: jax" in run.stderr  # the env inside the checkout ran the check
    missing = {line.split()[1] for line in lines if line.startswith("missing:")}
    assert missing == {canonicalize_name(name) for name in _gpu_wheels_names()}


def test_only_wheels_for_the_images_python_and_platform_install_there(tmp_path):
    installs = {
        "a-1.0-py3-none-any.whl": True,
        "b-1.0-cp312-cp312-manylinux_2_17_x86_64.manylinux2014_x86_64.whl": True,
        "c-1.0-cp38-abi3-manylinux_2_28_x86_64.whl": True,
        "d-1.0-cp311-cp311-manylinux_2_17_x86_64.whl": False,
        "e-1.0-cp312-cp312-macosx_11_0_arm64.whl": False,
        "f-1.0-cp312-cp312-manylinux_2_17_aarch64.whl": False,
        "g-1.0-cp312-cp312-manylinux_2_40_x86_64.whl": False,
    }
    for name in installs:
        (tmp_path / name).touch()
    found = {w.path.name: w.installs_on_image for w in gpu_image.read_wheels(tmp_path)}
    assert found == installs


def test_two_versions_of_a_wheel_or_more_than_travels_is_not_ready(tmp_path):
    for name in ("a-1.0-py3-none-any.whl", "a-2.0-py3-none-any.whl"):
        (tmp_path / name).touch()
    twice = gpu_image.Readiness({}, {}, set(), gpu_image.read_wheels(tmp_path), tree_bytes=0)
    assert [w.version for w in twice.duplicate_wheels] == ["1.0", "2.0"] and not twice.ready

    big = tmp_path / "big"
    big.mkdir()
    with open(big / "big-1.0-py3-none-any.whl", "wb") as f:
        f.truncate(gpu_image.TRAVEL_LIMIT_BYTES)  # sparse: the size without the bytes
    fits = gpu_image.Readiness({}, {}, set(), gpu_image.read_wheels(big), tree_bytes=0)
    assert fits.ready
    over = dataclasses.replace(fits, tree_bytes=1)
    assert not over.ready and "too large to travel" in " ".join(over.lines(big))


def test_a_version_the_project_does_not_allow_is_not_ready(tmp_path):
    (tmp_path / "flax-0.9.0-py3-none-any.whl").touch()
    needs = {"jax": SpecifierSet(">=0.6"), "flax": SpecifierSet(">=0.10"), "numpy": SpecifierSet(">=2")}
    image = {"jax": "0.5.0", "numpy": "2.5.2", "flax": None}
    readiness = gpu_image.Readiness(image, {}, set(), gpu_image.read_wheels(tmp_path), 0, needs)
    assert readiness.version_conflicts == [
        "flax 0.9.0 does not meet the project's requirement >=0.10",
        "jax 0.5.0 does not meet the project's requirement >=0.6",
    ]
    assert not readiness.ready


def test_an_unknown_mode_fails_in_one_line_before_any_run(tmp_path):
    script = ROOT / "scripts" / "benchmark.py"
    cmd = [sys.executable, str(script), "--modes=oxygen,oxygn", f"--out={tmp_path}"]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode == 2 and run.stderr.startswith("error: --modes: unknown ['oxygn']")
    assert not (tmp_path / "roofline.json").exists()


def test_wheels_folder_is_ignored_by_git():
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    assert subprocess.run(["git", "check-ignore", "-q", ".whl/x.whl"], cwd=ROOT, check=False).returncode == 0


def test_phases_against_the_reference_peaks():
    """7.9 TFLOP and 4.8 GB: 10 ms of matmuls at 790 TFLOP/s, 1 ms of reads at 4.8 TB/s."""
    peaks = gpu_summary.reference_peaks("NVIDIA H200")
    roof = {"phases": [{"phase": "prefill", "ms": 20.0, "flops": 7.9e12, "bytes": 4.8e9}]}
    (phase,) = gpu_summary.reference_phases(roof, peaks)
    assert phase["floor_ms"] == pytest.approx(10.0) and phase["bound"] == "compute"
    assert phase["x_floor"] == pytest.approx(2.0)
    assert gpu_summary.reference_peaks("cpu") is None


def _outputs(out: pathlib.Path) -> list[pathlib.Path]:
    return sorted(p for p in out.rglob("*") if p.is_file())


def test_no_time_left_skips_the_stages_and_still_reports(tmp_path):
    out = tmp_path / "out"
    run = _run("--smoke", str(out), env={"GPU_BUDGET_S": "0", "WHEELS_DIR": str(tmp_path / "none")})
    assert run.returncode == 1, run.stdout + run.stderr
    assert [p.name for p in _outputs(out)] == ["log_tail.txt", "results.md", "summary.json"]
    summary = json.loads((out / "summary.json").read_text())
    assert [(s["stage"], s["status"]) for s in summary["stages"]] == [
        ("ablation", "skipped"),
        ("serving", "skipped"),
        ("rtc", "skipped"),
    ]
    assert "roofline" not in summary and "no results" in (out / "results.md").read_text()


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    """The GPU path on CPU (~150 s on 2 cores), with one carried wheel to install from no index."""
    tmp = tmp_path_factory.mktemp("gpu_smoke")
    _wheel(tmp / "wheels", "oxygen_probe", "1.0", {"oxygen_probe/__init__.py": ""})
    env = {"WHEELS_DIR": str(tmp / "wheels"), "GPU_WORK": str(tmp / "work")}
    run = _run("--smoke", str(tmp / "out"), env=env, timeout=900)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    return tmp


@pytest.mark.slow
def test_smoke_leaves_at_most_eight_flat_files_that_come_back(smoke):
    out = smoke / "out"
    files = _outputs(out)
    assert 3 <= len(files) <= gpu_summary.MAX_FILES
    assert all(p.parent == out and p.stat().st_size <= gpu_summary.MAX_FILE_BYTES for p in files)
    assert all(re.fullmatch(r"[A-Za-z0-9._-]+", p.name) for p in files)
    assert {"summary.json", "results.md", "log_tail.txt", "ablation.png", "roofline.png"} <= {
        p.name for p in files
    }


@pytest.mark.slow
def test_smoke_summary_holds_what_the_gpu_run_measures(smoke):
    summary = json.loads((smoke / "out" / "summary.json").read_text())
    assert [(s["stage"], s["status"]) for s in summary["stages"]] == [
        ("wheels", "0"),
        ("ablation", "0"),
        ("serving", "0"),
        ("rtc", "0"),
    ]
    assert summary["config"] == "pi05_tiny" and summary["device_kind"] == "cpu" and "reference" not in summary
    head = summary["headline"]
    assert all(head[f"{mode}_hz"] > 0 for mode in gpu_summary.HEADLINE_MODES)
    assert head["isolated_tokens_per_s"] > 0 and head["oxygen_tokens_per_s"] > 0
    oxygen = next(r for r in summary["runs"] if r["spec"]["mode"] == "oxygen")
    assert head["sigma_hat_bytes"] == oxygen["state_bytes"] > 0 and head["sigma_hat_slots"] == 6
    assert all(r["spec"]["frames"] == 2 and r["spec"]["max_new"] == 30 for r in summary["runs"])
    phases = {p["phase"]: p for p in summary["roofline"]["phases"]}
    for name in ("prefill", "denoise", "decode_step_b1"):
        assert phases[name]["ms"] > 0 and phases[name]["floor_ms"] > 0, name
    settings = summary["serving"]["settings"]
    assert set(settings) == {"R1_T300", "R4_T0"}
    # Texts finished within 1 s per mode depend on the machine's load; texts started do not.
    assert all(s["modes"]["async"]["own_text_fraction"] > 0 for s in settings.values())
    # Guided against plain denoise on one engine, each batch compiled before it is timed.
    rtc = summary["rtc"]
    assert rtc["config"] == "pi05_tiny" and [b["batch"] for b in rtc["batches"]] == [1, 4]
    for b in rtc["batches"]:
        assert b["plain_ms"] > 0 and b["guided_ms"] > 0 and b["compiles_while_measuring"] == 0
        assert head[f"rtc_added_over_plain_b{b['batch']}"] == b["added_over_plain"]
        # A guided step adds a backward pass through the action expert: more work, whatever the load.
        assert b["guided_step_flops"] > b["plain_step_flops"]
    assert "## Real-time chunking: guided vs plain denoise" in (smoke / "out" / "results.md").read_text()
    # The carried wheel was installed without an index onto the path the benchmark ran with.
    assert summary["environment"]["carried"] == {"oxygen-probe": {"wheel": "1.0", "found": "1.0"}}


@pytest.mark.slow
def test_summary_of_a_run_stopped_before_serving_leaves_serving_and_rtc_out(smoke, tmp_path):
    work = tmp_path / "work"
    shutil.copytree(smoke / "work", work, ignore=shutil.ignore_patterns("serving", "rtc", "site", "xla"))
    cmd = [sys.executable, str(ROOT / "scripts" / "benchmark.py"), f"--gpu_summary={tmp_path / 'out'}"]
    run = subprocess.run([*cmd, f"--out={work}"], capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode == 0, run.stderr[-4000:]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert "serving" not in summary and "rtc" not in summary and summary["headline"]["oxygen_hz"] > 0
    assert not any(k.startswith("rtc_") for k in summary["headline"])
    results = (tmp_path / "out" / "results.md").read_text()
    assert "## Serving" not in results and "## Real-time chunking" not in results
