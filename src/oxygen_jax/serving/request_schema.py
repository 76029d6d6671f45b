"""The served request, declared in one place and checked whole before any work is done on it.

A request is one map: the robot's observation (the keys its `RawSpec` names, see `observation_fields`)
plus the request fields of `FIELDS`. `RequestSchema.check` splits it and runs the checks of the fields
that are the server's (a robot id, the form of an `rtc` entry); the robot's `Robot.prepare` then checks
the `rtc` entry against its last chunk, and `Policy.prepare` the options (`Policy.check_options`) and the
observation (`RobotIO.check`) first thing, before it transforms or tokenizes anything: each check runs
once, and nothing is queued before all of them passed. The first that fails refuses the request with a
one-line `InvalidRequest` (answered as "Bad request: ..."). Any other exception while serving is a server
fault, so every check must turn a bad value into `InvalidRequest` and nothing else
(tests/test_serving_request_fuzz.py generates requests across this schema to hold it to that).

The checks are the ones the policy and the robot run (`policies.request_options`, `Policy.check_options`,
`policies.text_tasks`, `RobotIO.check`, `robots.chunks.check_entry`): this module says which apply to
which field, for the docs' table and the tests; it does not restate them.
"""

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from oxygen_jax.client import protocol
from oxygen_jax.errors import InvalidRequest
from oxygen_jax.policies.policy import MAX_SAMPLES, MAX_TASK_TOKENS, MAX_TEMPERATURE, Policy
from oxygen_jax.policies.request_options import RequestOptions
from oxygen_jax.policies.robot_io import MAX_PROMPT_CHARS, RawSpec
from oxygen_jax.policies.text_tasks import MAX_INSTRUCTION_CHARS, MAX_TASK_NAME_CHARS
from oxygen_jax.robots import chunks

MAX_ROBOT_ID = 64


def robot_id(value: Any) -> str:
    """The robot's name, as replies and `/text` show it: printable (no newlines or terminal escapes)."""
    if not isinstance(value, str) or not 0 < len(value) <= MAX_ROBOT_ID or not value.isprintable():
        raise InvalidRequest(f"'robot_id': expected a printable string of 1 to {MAX_ROBOT_ID} characters")
    return value


@dataclasses.dataclass(frozen=True)
class Field:
    """One field of a served request: its name, what it accepts and within which bounds (as
    docs/serving.md's table says them), and its own check (`InvalidRequest` for a bad value); None for
    fields checked together: the options by `Policy.check_options`, the observation by `RobotIO.check`."""

    name: str
    accepts: str
    bounds: str
    check: Callable[["RequestSchema", Any], None] | None = None


# The request fields besides the observation; every one is optional (absent or None: the server's own).
FIELDS = (
    Field(
        "noise",
        "float array (or nested lists of numbers)",
        "[H, action_dim] or [samples, H, action_dim], finite",
    ),
    Field(
        "samples",
        "integer (as max_text_tokens)",
        f"1 to {MAX_SAMPLES} (the streaming server: to its max_samples); the reply keeps the densest chunk",
    ),
    Field(
        "max_text_tokens",
        "integer (int or numpy integer; not bool, not a numpy time)",
        "0 to the server's --max_text_tokens (0: no text)",
    ),
    Field(
        "temperature",
        "number (int, float or numpy number; not bool, not a numpy time)",
        f"finite, 0 to {MAX_TEMPERATURE:g}",
    ),
    Field(
        "top_p",
        "number (as temperature)",
        "finite, in (0, 1]",
    ),
    Field(
        "text_tasks",
        "map name -> instruction or -> {instruction, max_text_tokens, temperature}, or a list of such "
        "maps with a name",
        f"1 to the server's --max_text_tasks tasks; names unique, printable, 1 to {MAX_TASK_NAME_CHARS} "
        f"characters; instructions non-empty, at most {MAX_INSTRUCTION_CHARS} characters and "
        f"{MAX_TASK_TOKENS} tokens; options as at the top",
    ),
    Field(
        "robot_id",
        "str",
        f"1 to {MAX_ROBOT_ID} printable characters (no newlines or terminal escapes)",
        lambda _, value: robot_id(value),
    ),
    Field(
        protocol.RTC,
        f"map of {', '.join(chunks.FIELDS)} (integers; control_hz a number)",
        f"executed 0 to H, 0 <= delay < H, delay <= horizon <= H,"
        f" control_hz in (0, {chunks.MAX_CONTROL_HZ:g}]",
        lambda schema, value: schema.check_rtc(value),
    ),
)
FIELD_NAMES = tuple(field.name for field in FIELDS)
# The fields that are `RequestOptions` (checked together by `Policy.check_options`).
OPTION_NAMES = ("noise", "samples", "max_text_tokens", "temperature", "top_p", "text_tasks")


def observation_fields(spec: RawSpec) -> tuple[Field, ...]:
    """The observation keys a robot of `spec` sends (checked by `RobotIO.check`); other keys are ignored."""
    layouts = "[3, H, W]" if spec.channels_first_only else "[H, W, 3] or [3, H, W]"
    cameras = tuple(
        Field(
            "/".join(path),
            f"uint8 array, or float array with values in [0, 1]; {layouts}",
            "no side 0; not too elongated to resize to 224x224" + ("" if required else "; optional"),
        )
        for path, required in spec.cameras.items()
    )
    vectors = tuple(
        Field(
            "/".join(path),
            "numeric array, list or number",
            f"exactly {size} finite values" + (" (or one number)" if size == 1 else ""),
        )
        for path, size in spec.vectors.items()
    )
    prompt = Field(
        "prompt",
        "str (or UTF-8 bytes)",
        f"at most {MAX_PROMPT_CHARS} characters, fitting the model's token budget; optional",
    )
    return (*cameras, *vectors, prompt)


@dataclasses.dataclass(frozen=True)
class CheckedRequest:
    """A request that passed every check: the robot's observation (the request without its fields), the
    options as `Policy.infer` takes them, its robot id and its `rtc` entry (None: absent)."""

    obs: dict[str, Any]
    options: RequestOptions
    robot_id: str | None
    rtc: Any


class RequestSchema:
    """The request schema of one server: its policy (the model's action horizon an `rtc` entry is checked
    against) and whether it takes `rtc` (`rtc_refusal`: the one line that refuses it, None when it takes
    it)."""

    def __init__(self, policy: Policy, *, rtc_refusal: str | None = None):
        self.policy = policy
        self.rtc_refusal = rtc_refusal
        spec = policy.io.spec
        top_level = [(name,) for name in (*FIELD_NAMES, "prompt")]
        self._read = _read_tree([*top_level, *spec.cameras, *spec.vectors])

    def trimmed(self, request: dict[Any, Any]) -> dict[Any, Any]:
        """`request` without the values the server never reads: every other key keeps its name (so a bad
        request can still say which keys it got) with None for its value. The server trims a request as
        soon as it is decoded, so that an unread array (an extra 15 MB key) is not held while the request
        waits and is served."""
        return _trimmed(request, self._read)

    def check(self, request: Mapping[str, Any]) -> CheckedRequest:
        """The request split into its observation and fields, the server's fields checked in `FIELDS`
        order (`InvalidRequest` for the first that fails); its options and observation are
        `Policy.prepare`'s to check."""
        if not isinstance(request, Mapping):
            raise InvalidRequest(f"observation must be a map, got {type(request).__name__}")
        obs = dict(request)
        values = {name: obs.pop(name, None) for name in FIELD_NAMES}
        options = RequestOptions(**{name: values[name] for name in OPTION_NAMES if values[name] is not None})
        for field in FIELDS:
            if field.check is not None and values[field.name] is not None:
                field.check(self, values[field.name])
        return CheckedRequest(obs, options, values["robot_id"], values[protocol.RTC])

    def check_rtc(self, entry: Any) -> None:
        if self.rtc_refusal is not None:
            raise InvalidRequest(self.rtc_refusal)
        chunks.check_entry(entry, self.policy.engine.config.action_horizon)


# What the server reads of a request: key -> True (all of its value) or the same for the map it holds.
ReadTree = dict[str, "ReadTree | bool"]


def _read_tree(paths: list[tuple[str, ...]]) -> ReadTree:
    tree: ReadTree = {}
    for path in paths:
        level = tree
        for key in path[:-1]:
            level = level.setdefault(key, {})  # type: ignore[assignment]
        level[path[-1]] = True
    return tree


def _trimmed(value: Any, read: ReadTree) -> Any:
    """`value` with None for what `read` does not name; a value that is not a map where `read` expects
    one stays as it is, for the check to refuse."""
    if not isinstance(value, dict):
        return value
    kept = {}
    for key, item in value.items():
        below = read.get(key) if isinstance(key, str) else None
        kept[key] = item if below is True else None if below is None else _trimmed(item, below)
    return kept
