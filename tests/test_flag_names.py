"""One name and one meaning per idea across every tool, as docs/cli.md's table lists them, and each tool's
default config stated in its `--help` header.

Every tool module is imported in one fresh interpreter (each defines the shared flags, so the flags one
tool added are removed before the next is imported), which prints each tool's flags and docstring."""

import json
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
CLI_DOC = ROOT / "docs" / "cli.md"
TOOLS = sorted(
    p.stem for p in (ROOT / "src" / "oxygen_jax" / "tools").glob("*.py") if p.stem not in ("__init__", "cli")
)
DEPRECATED = re.compile(r"^Deprecated: use --(\w+)\.")

WALK = """
import importlib, json, sys
from absl import flags
from oxygen_jax.tools import cli  # its module-level flags (--mesh, multi-host) are every tool's
FLAGS = flags.FLAGS
tools = {}
for tool in sys.argv[1:]:
    before = set(FLAGS)
    module = importlib.import_module("oxygen_jax.tools." + tool)
    added = sorted(set(FLAGS) - before)
    config = FLAGS["config"].value if "config" in added else None
    tools[tool] = {
        "doc": module.__doc__,
        "config": getattr(config, "name", config),
        "flags": {name: FLAGS[name].help for name in added},
    }
    for name in added:
        delattr(FLAGS, name)
print(json.dumps(tools))
"""


@pytest.fixture(scope="module")
def tools() -> dict:
    run = subprocess.run(
        [sys.executable, "-c", WALK, *TOOLS], capture_output=True, text=True, timeout=300, check=False
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout)


def ideas() -> list[dict]:
    """docs/cli.md's table of ideas: flag names, the words their help says, the names refused."""
    text = CLI_DOC.read_text()
    table = text[text.index("| idea | flag |") :].split("\n\n")[0].splitlines()[2:]
    rows = []
    for line in table:
        idea, names, _, says, refused = (cell.strip() for cell in line.strip("|").split("|"))
        rows.append(
            {
                "idea": idea,
                "names": re.findall(r"`--(\w+)`", names),
                "says": [word.strip() for word in says.split(" or ")],
                "refused": re.findall(r"`--(\w+)`", refused),
            }
        )
    return rows


def test_the_table_lists_the_ideas_the_tools_share():
    listed = {name for row in ideas() for name in row["names"]}
    assert {"num_steps", "train_steps", "episodes", "tokenizer_path", "params_dtype", "seed", "out"} <= listed


def test_no_tool_gives_a_listed_idea_a_second_name(tools):
    problems = []
    for row in ideas():
        for tool, found in tools.items():
            for name in set(row["refused"]) & set(found["flags"]):
                deprecated = DEPRECATED.match(found["flags"][name])
                if not (deprecated and deprecated.group(1) in row["names"]):
                    problems.append(
                        f"{tool} --{name} is a second name for {row['idea']} (--{row['names'][0]})"
                    )
    assert problems == []


def test_a_listed_name_means_the_same_in_every_tool(tools):
    problems = []
    for row in ideas():
        for tool, found in tools.items():
            for name in set(row["names"]) & set(found["flags"]):
                help_text = found["flags"][name]
                if DEPRECATED.match(help_text):
                    continue  # a deprecated former name of another idea, checked above
                if not any(word.lower() in help_text.lower() for word in row["says"]):
                    problems.append(f"{tool} --{name}: {help_text!r} says none of {row['says']}")
    assert problems == []


def test_every_tool_takes_the_flags_its_task_needs(tools):
    """train got --tokenizer_path, --params_dtype and --seed; make_demo_dataset counts --episodes."""
    assert {"train_steps", "tokenizer_path", "params_dtype", "seed"} <= set(tools["train"]["flags"])
    assert {"episodes", "out", "seed"} <= set(tools["make_demo_dataset"]["flags"])


@pytest.mark.parametrize("tool", TOOLS)
def test_the_help_header_states_the_default_config(tools, tool):
    found = tools[tool]
    stated = re.search(r"Default config: (\w+)", found["doc"])
    if found["config"] is None:
        assert "no default config" in found["doc"], found["doc"]
    else:
        assert stated and stated.group(1) == found["config"], (tool, found["config"])


def test_the_default_configs_follow_the_one_rule(tools):
    """docs/cli.md: a tool defaults to the model of the task it runs; one tied to a robot, to its config."""
    defaults = {tool: found["config"] for tool, found in tools.items()}
    assert defaults == {
        "run": "pi05_demo",
        "infer": "pi05_demo",
        "train": "pi05_demo",
        "eval_table": "pi05_detour",
        "serve": "pi05_libero",
        "eval_libero": "pi05_libero",
        "eval_aloha": "pi05_aloha",
        "eval_droid": "pi05_droid",
        "benchmark": "pi05_cpu",
        "make_demo_dataset": None,
        "gpu_lab": None,
    }
