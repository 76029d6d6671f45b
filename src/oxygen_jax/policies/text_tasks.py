"""Several named language tasks on one observation: the request format and its checks.

A request's `text_tasks` is a map name -> instruction, or name -> {"instruction", "max_text_tokens",
"temperature"}, or a list of such dicts with a "name". Every mistake is a one-line `InvalidRequest` that
names the task, so a bad task fails its own request only. Names and instructions are capped in characters
here, before anything is tokenized; the options go through `request_options`, as at the request's top.
"""

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from oxygen_jax.errors import InvalidRequest
from oxygen_jax.policies.request_options import integer_option, number_option

_OPTIONS = ("instruction", "max_text_tokens", "temperature")
# Every event of the text stream repeats the task's name.
MAX_TASK_NAME_CHARS = 64
# An instruction is at most `policy.MAX_TASK_TOKENS` (32) tokens; no tokenizer makes fewer of more characters.
MAX_INSTRUCTION_CHARS = 1000


@dataclasses.dataclass(frozen=True)
class TextTask:
    """One task; None options fall back to the policy's (or the request's) own."""

    name: str
    instruction: str
    max_text_tokens: int | None = None
    temperature: float | None = None


def _task(name: Any, spec: Any) -> TextTask:
    if not isinstance(name, str) or not name:
        raise InvalidRequest(f"text task names must be non-empty strings, got {type(name).__name__}")
    if len(name) > MAX_TASK_NAME_CHARS:
        raise InvalidRequest(f"text task names: at most {MAX_TASK_NAME_CHARS} characters, got {len(name)}")
    if not name.isprintable():
        raise InvalidRequest("text task names must be printable (no newlines or terminal escapes)")
    if isinstance(spec, str):
        spec = {"instruction": spec}
    if not isinstance(spec, Mapping):
        raise InvalidRequest(
            f"text task {name!r}: expected an instruction string or a dict, got {type(spec).__name__}"
        )
    unknown = sorted(str(key) for key in set(spec) - set(_OPTIONS))  # keys of any types
    if unknown:
        raise InvalidRequest(f"text task {name!r}: unknown option(s) {unknown}; known: {list(_OPTIONS)}")
    instruction = spec.get("instruction")
    if not isinstance(instruction, str) or not instruction.strip():
        raise InvalidRequest(f"text task {name!r}: needs a non-empty 'instruction' string")
    if len(instruction) > MAX_INSTRUCTION_CHARS:
        length = len(instruction)
        raise InvalidRequest(
            f"text task {name!r}: instruction is {length} characters, at most {MAX_INSTRUCTION_CHARS}"
        )
    return TextTask(
        name,
        instruction,
        integer_option(spec.get("max_text_tokens"), f"text task {name}: max_text_tokens"),
        number_option(spec.get("temperature"), f"text task {name}: temperature"),
    )


def parse_text_tasks(
    tasks: Mapping[str, Any] | Sequence[Mapping[str, Any]], max_tasks: int | None = None
) -> list[TextTask]:
    """The request's tasks in order, checked (names unique, instructions non-empty, known options, at most
    `max_tasks` of them; None: any number)."""
    if isinstance(tasks, Mapping):
        parsed = [_task(name, spec) for name, spec in tasks.items()]
    elif isinstance(tasks, Sequence) and not isinstance(tasks, str | bytes):
        parsed = []
        for spec in tasks:
            if not isinstance(spec, Mapping):
                raise InvalidRequest(
                    f"a text task in a list must be a dict with a 'name', got {type(spec).__name__}"
                )
            options = {key: value for key, value in spec.items() if key != "name"}
            parsed.append(_task(spec.get("name"), options))
    else:
        raise InvalidRequest(
            f"text_tasks: expected a dict name -> instruction or a list, got {type(tasks).__name__}"
        )
    names = [t.name for t in parsed]
    if len(set(names)) != len(names):
        raise InvalidRequest(f"text_tasks: task names must be unique, got {names}")
    if not parsed:
        raise InvalidRequest("text_tasks: no task given")
    if max_tasks is not None and len(parsed) > max_tasks:
        limit = f"at most {max_tasks} tasks, got {len(parsed)}" if max_tasks else "none accepted here"
        raise InvalidRequest(f"text_tasks: {limit}")
    return parsed
