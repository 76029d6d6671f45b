"""Every malformed request is a refusal, never a server fault: thousands of generated requests across the
request schema (`serving/request_schema.py`) go through the code the server runs for a request.

The streaming backend (`SessionServerBackend.infer_async`, on the golden LIBERO policy's robot I/O over the
fake engine) gets a few requests per example on one connection, so `rtc` entries meet a robot that has a
last chunk; the inline backend (`PolicyServerBackend`, the tiny golden model) gets fewer, for its
text tasks. Each request must yield a reply with actions or an `InvalidRequest` of one line; anything else
is what the server answers as an internal error.
"""

import asyncio
import copy
import datetime

import hypothesis.extra.numpy as hnp
import hypothesis.strategies as st
import numpy as np
import pytest
from conftest import make_policy, raw_observation
from fake_engine import FakeEngine
from hypothesis import HealthCheck, given, settings

from oxygen_jax.errors import InvalidRequest
from oxygen_jax.robots.robots import Robots
from oxygen_jax.runtime.runtime import RuntimeConfig
from oxygen_jax.serving import msgpack_numpy
from oxygen_jax.serving.policy_backend import PolicyServerBackend, SessionServerBackend
from oxygen_jax.serving.request_decoding import BadRequestError, decode_request

# A state too large to normalize overflows in the transforms before `RobotIO` refuses it.
pytestmark = [
    pytest.mark.timeout(600),
    pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning"),
]

MAX_TEXT_TOKENS = 4
H, ACTION_DIM = 10, 32
# Default tier: well under a minute on a shared CPU; the slow tier runs many more.
EXAMPLES = 500
SLOW_EXAMPLES = 5000
INLINE_EXAMPLES = 60
SLOW_INLINE_EXAMPLES = 600

# --- values of every kind a msgpack-numpy message (or a careless client library) can carry ---

numpy_scalars = st.one_of(
    st.integers(-(2**63), 2**63 - 1).map(np.int64),
    st.integers(0, 255).map(np.uint8),
    st.integers(0, 2**64 - 1).map(np.uint64),
    st.floats(width=16).map(np.float16),
    st.floats(width=32).map(np.float32),
    st.floats().map(np.float64),
    st.booleans().map(np.bool_),
    st.integers(-5, 5).map(np.timedelta64),
    st.integers(0, 5).map(lambda n: np.datetime64(n, "s")),
    st.complex_numbers(max_magnitude=10).map(np.complex64),
    st.sampled_from([np.str_("3"), np.bytes_(b"3")]),
)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(-(2**70), 2**70),
    st.floats(),
    st.sampled_from([0, 1, -1, 0.0, -0.0, 1e-300, 1e308, float("inf"), float("-inf"), float("nan")]),
    st.text(max_size=8),
    st.binary(max_size=8),
    numpy_scalars,
    st.just(datetime.timedelta(seconds=1)),
)
ARRAY_DTYPES = [
    np.uint8,
    np.int8,
    np.uint16,
    np.int64,
    np.float16,
    np.float32,
    np.float64,
    np.bool_,
    np.complex64,
    "timedelta64[s]",
    "datetime64[s]",
    "U3",
    "S3",
]
small_arrays = hnp.arrays(
    st.sampled_from(ARRAY_DTYPES), hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=4)
)
junk = st.recursive(
    scalars | small_arrays,
    lambda children: (
        st.lists(children, max_size=3)
        | st.tuples(children, children)
        | st.dictionaries(st.text(max_size=4) | st.integers(-2, 2), children, max_size=3)
    ),
    max_leaves=6,
)
# Ragged and nested lists, which numpy cannot make a plain array of.
ragged = st.sampled_from([[[1.0, 2.0], [3.0]], [[0.0] * 8, 1.0], [[[1]], [2, 3]], [{"a": 1}, [1]], [[]]])


def integers_near(*bounds: int) -> st.SearchStrategy:
    """Integers at and around `bounds`, as Python ints and numpy integers."""
    near = st.sampled_from([b + d for b in bounds for d in (-1, 0, 1)])
    return st.one_of(near, near.map(np.int64), near.filter(lambda n: n >= 0).map(np.uint32), st.integers())


def numbers_near(*bounds: float) -> st.SearchStrategy:
    near = st.sampled_from([b * s + d for b in bounds for s in (1, -1) for d in (-1e-6, 0.0, 1e-6)])
    return st.one_of(near, near.map(np.float32), near.map(np.float64), st.floats(), st.integers(-3, 3))


# --- the observation's own keys (LIBERO: two cameras, an 8-value state, the prompt) ---

image_shapes = st.one_of(
    st.sampled_from(
        [
            (224, 224, 3),
            (3, 224, 224),
            (3, 3, 3),
            (1, 5000, 3),
            (5000, 1, 3),
            (3, 1, 5000),
            (2, 448, 3),
            (1, 1, 3),
            (3, 1, 1),
            (0, 224, 3),
            (224, 0, 3),
            (224, 224, 0),
            (224, 224, 4),
            (224, 224, 1),
            (224, 224),
            (1, 224, 224, 3),
            (3,),
            (),
        ]
    ),
    hnp.array_shapes(min_dims=1, max_dims=4, min_side=0, max_side=40),
    st.tuples(st.integers(0, 300), st.integers(0, 300)).map(lambda hw: (*hw, 3)),
    st.tuples(st.integers(0, 300), st.integers(0, 300)).map(lambda hw: (3, *hw)),
)
IMAGE_DTYPES = [
    np.uint8,
    np.float16,
    np.float32,
    np.float64,
    np.int8,
    np.uint16,
    np.bool_,
    np.complex64,
    "U1",
]


@st.composite
def images(draw) -> np.ndarray:
    shape = draw(image_shapes)
    dtype = np.dtype(draw(st.sampled_from(IMAGE_DTYPES)))
    if dtype.kind == "f":
        fill = draw(st.sampled_from([0.0, 0.5, 1.0, 1.0001, -0.0001, np.nan, np.inf, 1e4]))
        return np.full(shape, fill, dtype)
    return np.zeros(shape, dtype)


states = st.one_of(
    hnp.arrays(np.float32, 8, elements=st.floats(-10, 10, width=32)),
    hnp.arrays(
        st.sampled_from([np.float16, np.float64, np.int32, np.uint8, np.bool_, np.complex64]),
        st.sampled_from([(8,), (7,), (9,), (), (8, 1), (1, 8), (0,)]),
    ),
    st.lists(st.floats(), min_size=7, max_size=9),
    st.sampled_from([np.full(8, 1e308), np.full(8, -1e38, np.float32), np.full(8, np.finfo(np.float16).max)]),
    ragged,
    junk,
)
prompts = st.one_of(
    st.text(max_size=40),
    st.text(min_size=1, max_size=2).map(lambda t: t * 1000),  # around the 2000-character cap
    st.sampled_from(["", " ", "a" * 2000, "a" * 2001, "pick up the bowl " * 30, "\x00", "\n\x1b[31m"]),
    st.binary(max_size=8),
    st.text(max_size=8).map(np.str_),
    st.text(max_size=8).map(np.array),
    st.binary(max_size=8).map(np.array),
    junk,
)

# --- the request's own fields ---

noises = st.one_of(
    st.just(np.zeros((H, ACTION_DIM), np.float32)),
    st.just(np.zeros((1, H, ACTION_DIM), np.float32)),
    hnp.arrays(
        st.sampled_from([np.float16, np.float32, np.float64, np.int64, np.bool_, np.complex64, "U1"]),
        st.sampled_from([(H, ACTION_DIM), (1, H, ACTION_DIM), (2, H, ACTION_DIM), (H, 7), (ACTION_DIM,), ()]),
    ),
    st.sampled_from([np.full((H, ACTION_DIM), np.nan), np.full((H, ACTION_DIM), np.inf, np.float32)]),
    st.just(np.zeros((H, ACTION_DIM)).tolist()),
    ragged,
    junk,
)
# Map keys as msgpack decodes them (hashable); names elsewhere may be anything.
keys = st.one_of(
    st.text(min_size=1, max_size=8),
    st.sampled_from(["", "a" * 64, "a" * 65, "line\nbreak", "\x1b[2J", "tab\t"]),
    st.integers(-2, 2),
    st.binary(max_size=3),
    st.none(),
    st.booleans(),
)
names = keys | junk
instructions = st.one_of(
    st.text(min_size=1, max_size=30),
    st.sampled_from(["", "  ", "what next", "word " * 40, "a" * 1001]),
    junk,
)
task_options = st.fixed_dictionaries(
    {},
    optional={
        "instruction": instructions,
        "max_text_tokens": integers_near(0, MAX_TEXT_TOKENS) | junk,
        "temperature": numbers_near(0.0, 100.0) | junk,
        "colour": junk,
        1: junk,
    },
)
text_tasks = st.one_of(
    st.dictionaries(
        st.sampled_from(["narration", "memory", "next"]), st.text(min_size=1, max_size=20), max_size=3
    ),
    st.dictionaries(keys, instructions | task_options, max_size=3),
    st.lists(task_options.flatmap(lambda o: names.map(lambda n: {**o, "name": n})), max_size=3),
    st.lists(junk, max_size=2),
    junk,
)
RTC_FIELDS = ("executed", "delay", "horizon", "chunk_id")
rtc_entries = st.one_of(
    st.fixed_dictionaries(
        {},
        optional={
            **{name: integers_near(0, H - 1, H) | junk for name in RTC_FIELDS},
            "control_hz": numbers_near(0.0, 50.0, 10_000.0) | junk,
            "extra": junk,
            0: junk,
        },
    ),
    st.builds(
        lambda d, e: {"executed": e, "delay": d, "horizon": H}, st.integers(0, H - 1), st.integers(0, H)
    ),
    junk,
)
request_fields = {
    "noise": noises,
    "max_text_tokens": st.integers(0, MAX_TEXT_TOKENS) | integers_near(0, MAX_TEXT_TOKENS) | junk,
    "temperature": st.floats(0, 100) | numbers_near(0.0, 100.0) | junk,
    "top_p": st.floats(0, 1, exclude_min=True) | numbers_near(0.0, 1.0) | junk,
    "robot_id": st.text(st.characters(codec="ascii", min_codepoint=32), min_size=1, max_size=64) | names,
    "text_tasks": text_tasks,
    "rtc": rtc_entries,
    "observation/image": images(),
    "observation/wrist_image": images(),
    "observation/state": states,
    "prompt": prompts,
    "unknown": junk,
    "actions": junk,
    "images": junk,
}
MISSING = object()  # drops the key from the observation


@st.composite
def requests(draw) -> dict | BadRequestError:
    """The golden observation with some of its keys and the request's fields replaced, added or
    dropped; half of them as the server decodes them off the wire (read-only arrays, lists for tuples,
    or the decoder's own refusal)."""
    chosen = draw(st.lists(st.sampled_from(sorted(request_fields)), max_size=4, unique=True))
    request = raw_observation()
    for key in chosen:
        value = draw(request_fields[key] | st.just(MISSING))
        if value is MISSING:
            request.pop(key, None)
        else:
            request[key] = value
    return on_the_wire(request) if draw(st.booleans()) else request


def on_the_wire(request: dict) -> dict | BadRequestError:
    """`request` sent by a client and decoded by the server; as it is when no client can encode it."""
    try:
        message = msgpack_numpy.packb(request)
    except (TypeError, ValueError, OverflowError):
        return request
    try:
        return decode_request(message)
    except BadRequestError as refusal:
        return refusal


def _outcome(reply: dict | Exception) -> None:
    """A reply with actions, or a one-line refusal; anything else fails the test."""
    if isinstance(reply, InvalidRequest | BadRequestError):
        assert "\n" not in str(reply), str(reply)
        return
    if isinstance(reply, Exception):
        raise AssertionError(f"server fault: {type(reply).__name__}: {reply}") from reply
    assert reply["actions"].shape == (H, 7)


# --- the streaming backend on the fake engine ---


@pytest.fixture(scope="module")
def session_backend():
    policy = copy.copy(make_policy("dsi0", "float32", max_text_tokens=MAX_TEXT_TOKENS))
    policy.engine = FakeEngine(policy.engine.config)
    config = RuntimeConfig(max_slots=2, max_new_tokens=MAX_TEXT_TOKENS, max_prefill_batch=1)
    backend = SessionServerBackend(Robots(policy, config), prepare_workers=1, metrics=False)
    backend.warmup(raw_observation())
    yield backend
    backend.close()


def serve_one_connection(
    backend: SessionServerBackend | PolicyServerBackend, batch: list[dict]
) -> list[dict | Exception]:
    """The requests in order on one connection (one asyncio task, as the websocket server runs one)."""

    async def connection() -> list[dict | Exception]:
        replies = []
        for request in batch:
            if isinstance(request, BadRequestError):  # refused by the decoder: never reaches the backend
                replies.append(request)
                continue
            try:
                replies.append(await backend.infer_async(request))
            except Exception as error:
                replies.append(error)
        return replies

    return asyncio.run(connection())


def _fuzz_session(backend, batch) -> None:
    # A plain first request gives the robot a last chunk, so later `rtc` entries can be accepted.
    for reply in serve_one_connection(backend, [raw_observation(), *batch]):
        _outcome(reply)


SESSION_SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@settings(max_examples=EXAMPLES, **SESSION_SETTINGS)
@given(batch=st.lists(requests(), min_size=1, max_size=3))
def test_generated_requests_to_the_streaming_backend_are_replies_or_refusals(session_backend, batch):
    _fuzz_session(session_backend, batch)


@pytest.mark.slow
@settings(max_examples=SLOW_EXAMPLES, **SESSION_SETTINGS)
@given(batch=st.lists(requests(), min_size=1, max_size=3))
def test_many_generated_requests_to_the_streaming_backend_are_replies_or_refusals(session_backend, batch):
    _fuzz_session(session_backend, batch)


# --- the inline backend on the tiny golden model (text tasks decoded within the request) ---


@pytest.fixture(scope="module")
def inline_backend():
    return PolicyServerBackend(make_policy("dsi0", max_text_tokens=MAX_TEXT_TOKENS), metrics=False)


def _fuzz_inline(backend, request) -> None:
    # A plain first request gives the robot a last chunk, so a later `rtc` entry can be accepted.
    for reply in serve_one_connection(backend, [raw_observation(), request]):
        _outcome(reply)


@settings(max_examples=INLINE_EXAMPLES, **SESSION_SETTINGS)
@given(request=requests())
def test_generated_requests_to_the_inline_backend_are_replies_or_refusals(inline_backend, request):
    _fuzz_inline(inline_backend, request)


@pytest.mark.slow
@settings(max_examples=SLOW_INLINE_EXAMPLES, **SESSION_SETTINGS)
@given(request=requests())
def test_many_generated_requests_to_the_inline_backend_are_replies_or_refusals(inline_backend, request):
    _fuzz_inline(inline_backend, request)
