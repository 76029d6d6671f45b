"""Names that moved keep working for one release, with a DeprecationWarning naming the new place."""

import importlib
import sys

import pytest

from oxygen_jax.errors import InvalidRequest
from oxygen_jax.lerobot import reader, writer
from oxygen_jax.table_task import scenes


@pytest.mark.parametrize(
    "old, new, name",
    [
        ("oxygen_jax.evaluation.table_scenes", scenes, "render"),
        ("oxygen_jax.training.data.lerobot", reader, "__doc__"),
        ("oxygen_jax.training.data.lerobot_writer", writer, "__doc__"),
    ],
)
def test_moved_module_warns_and_gives_the_new_one(old, new, name):
    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=new.__name__):
        module = importlib.import_module(old)
    if name != "__doc__":
        assert getattr(module, name) is getattr(new, name)
    public = [
        n
        for n in dir(new)
        if not n.startswith("_") and getattr(getattr(new, n), "__module__", "") == new.__name__
    ]
    assert public and all(getattr(module, n) is getattr(new, n) for n in public)


def test_observation_error_is_invalid_request_with_a_warning():
    from oxygen_jax.policies import robot_io

    with pytest.warns(DeprecationWarning, match="InvalidRequest"):
        assert robot_io.ObservationError is InvalidRequest
