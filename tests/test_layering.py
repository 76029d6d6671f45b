"""Imports run downward only: models < engine < runtime < policies < serving / evaluation / benchmarks."""

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "src" / "oxygen_jax"
LAYERS = {
    "models": 0,
    "engine": 1,
    "runtime": 2,
    "policies": 3,
    "serving": 4,
    "evaluation": 4,
    "benchmarks": 4,
}


def imported_layers(path: pathlib.Path) -> set[str]:
    """The oxygen_jax layers a module imports (absolute imports, as the project writes them)."""
    layers = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        for name in names:
            parts = name.split(".")
            if parts[0] == "oxygen_jax" and len(parts) > 1 and parts[1] in LAYERS:
                layers.add(parts[1])
    return layers


@pytest.mark.parametrize("layer", sorted(LAYERS))
def test_no_module_imports_a_layer_above_its_own(layer):
    for path in sorted((PACKAGE / layer).rglob("*.py")):
        above = {other for other in imported_layers(path) if LAYERS[other] > LAYERS[layer]}
        assert not above, f"{path.relative_to(PACKAGE)} imports {sorted(above)}, a layer above {layer}"
