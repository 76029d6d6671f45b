"""third_party/openpi_patches: headers name the openpi commit, bodies are well-formed unified diffs.

With OPENPI_CHECKOUT=<an openpi checkout> the patches are also checked with `git apply --check` there, and
the restore_params patch is run against the installed orbax-checkpoint on a checkpoint written here.
"""

import ast
import os
import pathlib
import re
import shutil
import subprocess
import typing

import numpy as np
import pytest

PATCH_DIR = pathlib.Path(__file__).resolve().parents[1] / "third_party" / "openpi_patches"
OPENPI_COMMIT = "15a9616a00943ada6c20a0f158e3adb39df2ccac"
PATCHES = sorted(PATCH_DIR.glob("*.patch"))
# Each patch and the openpi file it changes.
EXPECTED_FILES = {
    "0001-restore-params-orbax-0.12.patch": ["src/openpi/models/model.py"],
    "0002-serve-policy-oxygen-jax.patch": ["scripts/serve_policy.py"],
}

_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


def _split(text: str) -> tuple[list[str], list[str]]:
    """(header lines before the first `diff --git`, the diff lines)."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("diff --git ")), len(lines))
    return lines[:start], lines[start:]


def _parse_diff(lines: list[str]) -> dict[str, list[tuple[int, int, int, int]]]:
    """Checks the structure of a git unified diff; returns path -> hunks (old start/len, new start/len)."""
    files: dict[str, list[tuple[int, int, int, int]]] = {}
    i = 0
    while i < len(lines):
        match = re.fullmatch(r"diff --git a/(\S+) b/(\S+)", lines[i])
        assert match, f"line {i + 1}: expected 'diff --git a/X b/X', got {lines[i]!r}"
        assert match[1] == match[2], f"line {i + 1}: renames are not expected: {lines[i]!r}"
        path = match[1]
        i += 1
        if i < len(lines) and lines[i].startswith("index "):
            assert re.fullmatch(r"index [0-9a-f]{7,40}\.\.[0-9a-f]{7,40}( \d{6})?", lines[i]), lines[i]
            i += 1
        assert lines[i] == f"--- a/{path}", f"line {i + 1}: {lines[i]!r}"
        assert lines[i + 1] == f"+++ b/{path}", f"line {i + 2}: {lines[i + 1]!r}"
        i += 2
        hunks = []
        shift = 0  # new start - old start, from the hunks so far
        while i < len(lines) and lines[i].startswith("@@"):
            match = _HUNK.match(lines[i])
            assert match, f"line {i + 1}: malformed hunk header {lines[i]!r}"
            old_start, new_start = int(match[1]), int(match[3])
            old_len = int(match[2]) if match[2] is not None else 1
            new_len = int(match[4]) if match[4] is not None else 1
            assert not hunks or old_start >= hunks[-1][0] + hunks[-1][1], f"line {i + 1}: hunks overlap"
            assert new_start - old_start == shift, f"line {i + 1}: new start inconsistent with earlier hunks"
            i += 1
            old_seen = new_seen = 0
            while i < len(lines) and (old_seen < old_len or new_seen < new_len):
                line = lines[i]
                kind = line[:1]
                assert kind in (" ", "-", "+", "\\"), f"line {i + 1}: not a diff line: {line!r}"
                old_seen += kind in (" ", "-")
                new_seen += kind in (" ", "+")
                i += 1
            assert (old_seen, new_seen) == (old_len, new_len), (
                f"{path}: hunk @@ -{old_start},{old_len} +{new_start},{new_len} @@ has "
                f"{old_seen} old and {new_seen} new lines"
            )
            while i < len(lines) and lines[i].startswith("\\"):
                i += 1
            hunks.append((old_start, old_len, new_start, new_len))
            shift += new_len - old_len
        assert hunks, f"{path}: no hunks"
        assert path not in files, f"{path} appears twice"
        files[path] = hunks
    return files


def test_patch_set_is_as_documented():
    assert [p.name for p in PATCHES] == sorted(EXPECTED_FILES)
    readme = (PATCH_DIR / "README.md").read_text()
    assert OPENPI_COMMIT in readme
    for patch in PATCHES:
        assert patch.name in readme, f"README.md does not mention {patch.name}"


@pytest.mark.parametrize("patch", PATCHES, ids=lambda p: p.name)
def test_header_names_the_openpi_commit(patch):
    header, diff = _split(patch.read_text())
    assert diff, f"{patch.name} holds no 'diff --git' section"
    commits = [m[1] for line in header if (m := re.search(r"openpi commit: ([0-9a-f]+)", line))]
    assert commits == [OPENPI_COMMIT], f"header must name openpi commit {OPENPI_COMMIT}, got {commits}"
    # Header lines must not be taken for diff lines by git apply or patch.
    assert not any(line.startswith(("--- ", "+++ ", "@@", "diff ")) for line in header)


@pytest.mark.parametrize("patch", PATCHES, ids=lambda p: p.name)
def test_patch_is_a_well_formed_unified_diff(patch):
    text = patch.read_text()
    assert text.endswith("\n") and "\r" not in text
    _, diff = _split(text)
    files = _parse_diff(diff)
    assert sorted(files) == sorted(EXPECTED_FILES[patch.name])
    added = [line[1:] for line in diff if line.startswith("+") and not line.startswith("+++")]
    assert added and all(not line.endswith((" ", "\t")) for line in added), "trailing whitespace"


def test_restore_params_patch_reads_item_metadata():
    """The added lines are what the fix needs, whatever the surrounding context."""
    _, diff = _split((PATCH_DIR / "0001-restore-params-orbax-0.12.patch").read_text())
    added = "\n".join(line[1:] for line in diff if line.startswith("+") and not line.startswith("+++"))
    assert 'getattr(metadata, "item_metadata", metadata)' in added


def _checkout() -> pathlib.Path:
    path = os.environ.get("OPENPI_CHECKOUT")
    if not path:
        pytest.skip("set OPENPI_CHECKOUT to an openpi checkout to run git apply --check")
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    checkout = pathlib.Path(path).expanduser()
    assert (checkout / "src" / "openpi").is_dir(), f"OPENPI_CHECKOUT={path} is not an openpi checkout"
    return checkout


@pytest.mark.parametrize("patch", PATCHES, ids=lambda p: p.name)
def test_git_apply_check_on_openpi_checkout(patch):
    checkout = _checkout()
    result = subprocess.run(
        ["git", "apply", "--check", str(patch)], cwd=checkout, capture_output=True, text=True, check=False
    )
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=checkout, capture_output=True, text=True, check=False
    ).stdout.strip()
    assert result.returncode == 0, (
        f"git apply --check {patch.name} failed in {checkout} (HEAD {head or 'unknown'}; the patch is "
        f"made for {OPENPI_COMMIT}):\n{result.stderr}"
    )


def test_patched_restore_params_loads_with_installed_orbax(tmp_path):
    """Applies 0001 to a copy of the checkout's model.py and runs its restore_params on a fresh checkpoint."""
    checkout = _checkout()
    import jax
    import jax.numpy as jnp
    import orbax.checkpoint as ocp
    from flax import traverse_util

    from oxygen_jax import checkpoints

    target = tmp_path / "openpi"
    (target / "src" / "openpi" / "models").mkdir(parents=True)
    shutil.copy(checkout / "src/openpi/models/model.py", target / "src/openpi/models/model.py")
    patch = PATCH_DIR / "0001-restore-params-orbax-0.12.patch"
    subprocess.run(["git", "apply", str(patch)], cwd=target, check=True, capture_output=True)

    source = (target / "src/openpi/models/model.py").read_text()
    function = next(
        node
        for node in ast.parse(source).body
        if isinstance(node, ast.FunctionDef) and node.name == "restore_params"
    )

    class _ArrayTyping:
        Params = typing.Any

    namespace = {
        "jax": jax,
        "jnp": jnp,
        "np": np,
        "ocp": ocp,
        "pathlib": pathlib,
        "traverse_util": traverse_util,
        "at": _ArrayTyping,
    }
    exec(compile(ast.Module([function], type_ignores=[]), "model.py", "exec"), namespace)

    params = {"PaliGemma": {"llm": {"w": np.arange(6, dtype=np.float32).reshape(2, 3)}}, "b": np.ones(4)}
    path = checkpoints.save_params(tmp_path / "ckpt", params)
    restored = namespace["restore_params"](path, restore_type=np.ndarray)
    np.testing.assert_array_equal(restored["PaliGemma"]["llm"]["w"], params["PaliGemma"]["llm"]["w"])
    np.testing.assert_array_equal(restored["b"], params["b"])
