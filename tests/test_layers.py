"""The layering of docs/engine.md: a package imports only the packages below it, never one above nor a peer
of its own layer; packages beside the stack import no layer above the engine."""

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "src" / "oxygen_jax"
# Lowest first.
LAYERS = {
    "client": -1,  # robot side, next to openpi-client: below every layer, so it imports none of them
    "models": 0,
    "engine": 1,
    "runtime": 2,
    "policies": 3,
    "robots": 4,  # one robot's state and request sequence; many robots over one runtime
    "table_task": 5,
    "serving": 6,
    "evaluation": 6,
    "benchmarks": 6,
    "training": 6,
    "tools": 7,  # the command-line tools: the top, imported by nothing in the package
}
# Beside the stack, importable from any layer: the top-level modules (config, checkpoints, params,
# tokenizer, cli, ...), configs/ and the LeRobot dataset format.
BESIDE = ("configs", "lerobot")


def _imported_packages(path: pathlib.Path) -> set[str]:
    """Top-level oxygen_jax packages or modules that a file imports."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "oxygen_jax":
            parts = node.module.split(".")
            found.update([parts[1]] if len(parts) > 1 else [alias.name for alias in node.names])
        elif isinstance(node, ast.Import):
            found.update(a.name.split(".")[1] for a in node.names if a.name.startswith("oxygen_jax."))
    return found


def _imports(files) -> set[tuple[str, str]]:
    """(file, imported package) for every oxygen_jax import in `files`."""
    return {(str(path.relative_to(PACKAGE)), name) for path in files for name in _imported_packages(path)}


def _package_imports(package: str) -> set[tuple[str, str]]:
    return _imports((PACKAGE / package).rglob("*.py"))


def _imports_above(level: int, imports: set[tuple[str, str]]) -> set[str]:
    return {f"{path} imports {name}" for path, name in imports if LAYERS.get(name, -1) > level}


def test_every_package_has_a_room():
    packages = {path.parent.name for path in PACKAGE.glob("*/__init__.py")}
    assert packages == set(LAYERS) | set(BESIDE)


@pytest.mark.parametrize("package", sorted(LAYERS))
def test_package_imports_nothing_above_it(package):
    assert not _imports_above(LAYERS[package], _package_imports(package))


def _peer_imports(package: str, imports: set[tuple[str, str]]) -> set[str]:
    return {
        f"{path} imports {name}"
        for path, name in imports
        if name != package and LAYERS.get(name) == LAYERS[package]
    }


@pytest.mark.parametrize("package", sorted(LAYERS))
def test_package_imports_no_peer_of_its_layer(package):
    assert not _peer_imports(package, _package_imports(package))


def test_the_peer_check_catches_evaluation_importing_training(tmp_path):
    module = tmp_path / "recording.py"
    module.write_text("from oxygen_jax.training.data import lerobot_writer\nimport oxygen_jax.policies\n")
    imports = {("evaluation/recording.py", name) for name in _imported_packages(module)}
    assert _peer_imports("evaluation", imports) == {"evaluation/recording.py imports training"}


@pytest.mark.parametrize("package", BESIDE)
def test_packages_beside_the_stack_import_no_layer_above_the_engine(package):
    assert not _imports_above(LAYERS["engine"], _package_imports(package))


def test_top_level_modules_import_no_layer_above_the_engine():
    assert not _imports_above(LAYERS["engine"], _imports(PACKAGE.glob("*.py")))


# The engine's request entry points: on a robot's path only `runtime/` calls them.
ENGINE_REQUEST_CALLS = {"act", "prefill", "denoise", "select_rows", "generate", "extend", "insert", "decode"}
# Packages a robot's request passes through; the engine's own benchmarks and `oxygen-infer` time it directly.
ROBOT_PATH = ("policies", "robots", "serving", "table_task", "evaluation")


def _engine_calls(path: pathlib.Path, root: pathlib.Path = PACKAGE) -> set[str]:
    """`<...>engine.<entry point>(` calls in a file, as `file:line name`."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner = node.func.value
            name = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", "")
            if name.endswith("engine") and node.func.attr in ENGINE_REQUEST_CALLS:
                found.add(f"{path.relative_to(root)}:{node.lineno} {node.func.attr}")
    return found


@pytest.mark.parametrize("package", ROBOT_PATH)
def test_a_robots_request_reaches_the_engine_only_through_the_runtime(package):
    assert not set().union(*(_engine_calls(path) for path in (PACKAGE / package).rglob("*.py")))


def test_the_engine_call_check_finds_a_policy_calling_the_engine(tmp_path):
    module = tmp_path / "policy.py"
    module.write_text("def execute(self, obs):\n    return self.engine.act(obs, noise, 10)\n")
    assert _engine_calls(module, tmp_path) == {"policy.py:2 act"}


def test_policies_import_nothing_of_the_robot_side_client():
    assert not {f"{path} imports client" for path, name in _package_imports("policies") if name == "client"}
