"""notebooks/: committed without outputs, and each runs top to bottom on the tiny config in this venv.

The notebooks execute with nbclient on an ipykernel that runs this interpreter (`sys.executable`), so they
see exactly the installed oxygen_jax. A failing cell fails the test with the cell's traceback.
The benchmarks notebook plots JSON from `OXYGEN_BENCH_DIR`: the test first writes a tiny run of
`scripts/benchmark.py --quick` there, or copies recorded results from `benchmarks/results/`.
"""

import json
import os
import pathlib
import shutil
import subprocess
import sys
import time
import tomllib

import nbclient
import nbformat
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
NOTEBOOK_FILES = sorted(NOTEBOOKS.glob("*.ipynb"))
RESULTS = ROOT / "benchmarks" / "results"
BENCHMARK_SCRIPT = ROOT / "scripts" / "benchmark.py"
KERNEL_NAME = "oxygen-jax-test"
# The project's repository as pyproject.toml's [project.urls] names it: the notebooks' default.
REPOSITORY = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["urls"]["Repository"]
REPO_URL_SOURCE = f'REPO_URL = os.environ.get("OXYGEN_REPO_URL", "{REPOSITORY}")'
CELL_TIMEOUT_S = 600


def test_notebooks_exist():
    assert {p.name for p in NOTEBOOK_FILES} >= {"quickstart.ipynb", "benchmarks.ipynb"}


@pytest.mark.parametrize("path", NOTEBOOK_FILES, ids=lambda p: p.name)
def test_notebook_is_committed_without_outputs(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        assert cell.outputs == [], f"{path.name} cell {index} has outputs: clear them before committing"
        assert cell.execution_count is None, f"{path.name} cell {index} has an execution count"
    for key in ("widgets", "execution"):
        assert key not in nb.metadata, f"{path.name} notebook metadata holds run state {key!r}"


@pytest.mark.parametrize("path", NOTEBOOK_FILES, ids=lambda p: p.name)
def test_notebook_installs_from_the_documented_repository(path):
    """The install cell reads the project's repository from pyproject.toml's [project.urls] (so a Colab
    user edits nothing), OXYGEN_REPO_URL overrides it, and the first cell says both; no other address is
    written into a notebook's code."""
    nb = nbformat.read(path, as_version=4)
    assert "OXYGEN_REPO_URL" in nb.cells[0].source and REPOSITORY in nb.cells[0].source
    sources = [cell.source for cell in nb.cells if cell.cell_type == "code"]
    assert sum(REPO_URL_SOURCE in source for source in sources) == 1
    assert sum(source.count("://") for source in sources) == 1


@pytest.fixture
def kernel(tmp_path, monkeypatch):
    """A kernelspec running this interpreter, found through JUPYTER_PATH (the kernel inherits os.environ)."""
    spec_dir = tmp_path / "jupyter" / "kernels" / KERNEL_NAME
    spec_dir.mkdir(parents=True)
    spec = {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "oxygen_jax test",
        "language": "python",
    }
    (spec_dir / "kernel.json").write_text(json.dumps(spec))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    monkeypatch.setenv("OXYGEN_NB_CONFIG", "pi05_tiny")
    monkeypatch.delenv("OXYGEN_NB_CHECKPOINT", raising=False)
    monkeypatch.delenv("MPLBACKEND", raising=False)  # ipykernel's inline backend
    return KERNEL_NAME


def _execute(name: str, kernel_name: str):
    """Runs notebooks/<name> in its folder and returns the executed notebook; fails on the first failing
    cell."""
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    client = nbclient.NotebookClient(
        nb,
        kernel_name=kernel_name,
        timeout=CELL_TIMEOUT_S,
        startup_timeout=120,
        resources={"metadata": {"path": str(NOTEBOOKS)}},
    )
    start = time.perf_counter()
    try:
        client.execute()
    except nbclient.exceptions.CellExecutionError as error:
        pytest.fail(f"{name}: a cell failed:\n{error}", pytrace=False)
    seconds = time.perf_counter() - start
    print(f"{name} ran in {seconds:.1f} s")
    return nb


def _outputs(nb) -> tuple[str, int]:
    """(all text the notebook printed, how many images it displayed)."""
    texts, images = [], 0
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            texts.append(output.get("text", "") or output.get("data", {}).get("text/plain", ""))
            images += "image/png" in output.get("data", {})
    return "\n".join(texts), images


@pytest.mark.integration
@pytest.mark.timeout(900)
def test_quickstart_runs(kernel, monkeypatch):
    monkeypatch.setenv("OXYGEN_NB_FRAMES", "16")
    monkeypatch.setenv("OXYGEN_NB_TRAIN_STEPS", "2")
    monkeypatch.setenv("OXYGEN_NB_TRAIN_SCENES", "4")
    text, images = _outputs(_execute("quickstart.ipynb", kernel))
    assert "pi05_tiny" in text and "request  0:" in text and "actions (10, 7)" in text
    assert "after 2 steps: subtask exact match" in text
    assert all(f"task {name}:" in text for name in ("subtask", "narration", "memory"))
    assert images >= 1


def _tiny_benchmark_results(out: pathlib.Path, cache: pathlib.Path) -> str:
    """Fills `out` with benchmark JSON: a tiny real run of the benchmark script when it exists, else the
    recorded results. Returns where the data came from."""
    if BENCHMARK_SCRIPT.exists():
        command = [
            sys.executable,
            str(BENCHMARK_SCRIPT),
            "--quick",
            "--config=pi05_tiny",
            "--frames=2",
            f"--out={out / 'tiny-ci'}",
            f"--jax_cache_dir={cache}",
        ]
        result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=900, check=False)
        assert result.returncode == 0, f"{' '.join(command)} failed:\n{result.stdout}\n{result.stderr}"
        return "scripts/benchmark.py --quick on pi05_tiny"
    recorded = sorted(RESULTS.rglob("*.json")) if RESULTS.is_dir() else []
    if not recorded:
        pytest.fail(f"no {BENCHMARK_SCRIPT.relative_to(ROOT)} and no recorded results under {RESULTS}")
    for path in recorded:
        target = out / path.relative_to(RESULTS)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, target)
    return f"recorded results ({len(recorded)} files)"


@pytest.mark.slow  # ~2 min; the benchmark code it drives is tested by test_benchmark.py
@pytest.mark.timeout(1800)
def test_benchmarks_notebook_runs(kernel, monkeypatch, tmp_path):
    out = tmp_path / "results"
    out.mkdir()
    origin = _tiny_benchmark_results(out, tmp_path / "xla-cache")
    print(f"benchmark data: {origin}")
    monkeypatch.setenv("OXYGEN_BENCH_DIR", str(out))
    monkeypatch.setenv("OXYGEN_BENCH_REQUIRE_DATA", "1")
    _, images = _outputs(_execute("benchmarks.ipynb", kernel))
    assert images >= 1


def test_kernel_runs_this_interpreter(kernel):
    """The kernelspec the notebooks run on is this venv's python (so the test sees what CI installed)."""
    from jupyter_client.kernelspec import KernelSpecManager

    spec = KernelSpecManager().get_kernel_spec(kernel)
    assert spec.argv[0] == sys.executable
    assert os.path.exists(spec.argv[0])
    assert subprocess.run([spec.argv[0], "-c", "import ipykernel, oxygen_jax"], check=False).returncode == 0
