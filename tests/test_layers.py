"""The layering of docs/engine.md: a package imports only the packages below it, never one above."""

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "src" / "oxygen_jax"
# Lowest first; the top-level modules (config, checkpoints, params, tokenizer, cli, ...) sit beside.
LAYERS = {
    "client": -1,  # robot side, next to openpi-client: below every layer, so it imports none of them
    "models": 0,
    "engine": 1,
    "runtime": 2,
    "policies": 3,
    "serving": 4,
    "evaluation": 4,
    "benchmarks": 4,
    "training": 4,
}


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


@pytest.mark.parametrize("package", sorted(LAYERS))
def test_package_imports_nothing_above_it(package):
    upward = {
        f"{path.relative_to(PACKAGE)} imports {name}"
        for path in (PACKAGE / package).rglob("*.py")
        for name in _imported_packages(path)
        if LAYERS.get(name, -1) > LAYERS[package]
    }
    assert not upward


def test_top_level_modules_import_no_layer_above_the_engine():
    upward = {
        f"{path.name} imports {name}"
        for path in PACKAGE.glob("*.py")
        for name in _imported_packages(path)
        if LAYERS.get(name, -1) > LAYERS["engine"]
    }
    assert not upward
