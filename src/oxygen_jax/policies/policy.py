"""A robot policy: the engine, one robot's transforms and the tokenizer, behind openpi's `infer(obs)`.

Drop-in for openpi's `Policy`: one unbatched raw observation in, robot-space `actions` [H, robot dims]
and `policy_timing` out. With language on, `text` comes from the same prefill as the actions, so speaking
never costs a second pass over the images.

A request takes one path wherever it is served: `Policy.prepare` (checks, robot transforms, tokenizing,
text tasks; stateless) -> a runtime (here the engine called inline; served, the shared `runtime.Runtime`)
-> `Policy.finish` (output transforms, detokenizing; stateless).
"""

import dataclasses
import functools
import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

import ml_collections
import numpy as np

from oxygen_jax import checkpoints, config
from oxygen_jax.engine import mesh, prompt_buckets
from oxygen_jax.engine.api import ChunkGuidance
from oxygen_jax.engine.engine import Engine
from oxygen_jax.errors import ConfigError, InvalidRequest
from oxygen_jax.models import inputs as _inputs
from oxygen_jax.params import load_params
from oxygen_jax.policies import (
    aloha,
    chunk_choice,
    droid,
    libero,
    normalization,
    rtc_defaults,
    table,
    transforms,
)
from oxygen_jax.policies.executed_chunk import ExecutedChunkGuidance
from oxygen_jax.policies.request_options import RequestOptions, integer_option, number_option
from oxygen_jax.policies.robot_io import RawSpec, RobotIO
from oxygen_jax.policies.text_tasks import TextTask, parse_text_tasks
from oxygen_jax.runtime.inline import MAX_TASK_TOKENS, InlineRuntime, Speech, TextPlan
from oxygen_jax.tokenizer import Tokenizer, pad_or_truncate

logger = logging.getLogger(__name__)

# Sampling at a higher temperature is indistinguishable from uniform over the vocabulary.
MAX_TEMPERATURE = 100.0

MAX_SAMPLES = 64  # action chunks one request may draw (`RequestOptions.samples`)
_DEFAULT_OPTIONS = RequestOptions()  # frozen: one shared default


@dataclasses.dataclass(frozen=True)
class _RobotKind:
    """What a policy needs of one kind of robot (a config's `robot`): its transforms, raw observation and
    action dims."""

    make_pipeline: Callable[..., transforms.Pipeline]
    raw_spec: RawSpec
    action_dim: int
    metadata: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    # The prompt of observations that carry none (openpi's data config `default_prompt`).
    default_prompt: str | None = None


_ROBOTS = {
    "libero": _RobotKind(libero.make_libero_pipeline, libero.RAW_SPEC, libero.ACTION_DIM),
    "droid": _RobotKind(droid.make_droid_pipeline, droid.RAW_SPEC, droid.ACTION_DIM),
    # openpi's pi05_aloha policy metadata: the arm pose clients reset to.
    "aloha": _RobotKind(
        aloha.make_aloha_pipeline, aloha.RAW_SPEC, aloha.ACTION_DIM, {"reset_pose": [0, -1.5, 1.5, 0, 0, 0]}
    ),
    # openpi's ALOHA sim data (pi0_aloha_sim): absolute joint actions and the one task's prompt.
    "aloha_sim": _RobotKind(
        functools.partial(aloha.make_aloha_pipeline, use_delta_joint_actions=False),
        aloha.RAW_SPEC,
        aloha.ACTION_DIM,
        default_prompt="Transfer cube",
    ),
    "table": _RobotKind(table.make_table_pipeline, table.RAW_SPEC, table.ACTION_DIM),
}


def robot(cfg) -> _RobotKind:
    """The robot a config names (`cfg.robot`), or a one-line error listing the known ones."""
    found = _ROBOTS.get(cfg.robot)
    if found is None:
        raise ConfigError(
            f"config {cfg.name!r} has robot {cfg.robot!r}; a policy needs one of {sorted(_ROBOTS)}"
        )
    return found


def robot_pipeline(
    cfg,
    norm_stats: Mapping[str, normalization.NormStats] | None,
    tokenizer: transforms.PromptTokenizer,
    *,
    default_prompt: str | None = None,
) -> transforms.Pipeline:
    """The config's robot transforms around the model (serving and training use the same ones); prompt-less
    observations get `default_prompt`, else the robot's (as openpi's data configs)."""
    found = robot(cfg)
    return found.make_pipeline(
        norm_stats,
        tokenizer,
        action_dim=cfg.model.action_dim,
        discrete_state_input=cfg.model.discrete_state_input,
        default_prompt=found.default_prompt if default_prompt is None else default_prompt,
    )


@dataclasses.dataclass(frozen=True)
class _FittingPrompt:
    """Refuses a task prompt that alone overflows the model's `max_len` (openpi would cut the task text
    with only a log line). A discrete state that overflows is cut as openpi does: the model was trained
    on such prompts."""

    tokenizer: Tokenizer

    def tokenize(self, prompt: str, state: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        tokens, max_len = self.tokenizer.prompt_tokens(prompt, state), self.tokenizer.max_len
        if len(tokens) > max_len and (state is None or len(self.tokenizer.prompt_tokens(prompt)) > max_len):
            raise InvalidRequest(f"prompt too long: it does not fit in max_token_len {max_len} tokens")
        return pad_or_truncate(tokens, max_len)


@dataclasses.dataclass(frozen=True)
class CheckedOptions:
    """A request's options as `Policy.check_options` found them: the language requests it starts (seeds
    still 0: `prepare` draws them), the action chunks to draw and the noise [samples, H, action_dim]
    float32, or None."""

    texts: tuple[TextPlan, ...]
    samples: int
    noise: np.ndarray | None


@dataclasses.dataclass(frozen=True)
class PreparedRequest:
    """A raw request after `Policy.prepare`: everything the runtime needs and nothing of the robot's own.

    arrays: the canonical model inputs with batch dim 1; noise: [samples, H, action_dim] float32, or None
    to draw it where the actions are computed (from `noise_seed`); samples: action chunks to draw; texts:
    the language requests it starts (none: actions only); state: the normalized state the output
    transforms read back in `finish`; guidance: the denoiser's real-time-chunking guidance, or None for
    plain actions.
    """

    arrays: dict[str, np.ndarray]
    noise: np.ndarray | None
    noise_seed: int
    texts: tuple[TextPlan, ...]
    state: np.ndarray
    guidance: ChunkGuidance | None = None
    samples: int = 1


class Policy:
    """Engine + robot I/O + tokenizer behind two stateless, thread-safe stages, `prepare` and `finish`;
    `infer` runs one request through them with the engine in between."""

    def __init__(
        self,
        engine: Engine,
        io: RobotIO,
        tokenizer: Tokenizer,
        *,
        num_steps: int = 10,
        max_text_tokens: int = 0,
        temperature: float = 0.0,
        top_p: float = 1.0,
        seed: int = 0,
        metadata: Mapping[str, Any] | None = None,
        checkpoint: str | None = None,
    ) -> None:
        self.engine = engine
        self.checkpoint = checkpoint  # where the params came from (None: random init), for `repr`
        self.num_steps = num_steps
        self.max_text_tokens = max_text_tokens
        self.io = io
        self._tokenizer = tokenizer
        self._temperature = temperature
        self._top_p = top_p
        # Per-request seeds for the noise and the text sampler, reproducible from `seed`; the lock makes
        # `prepare` safe from several threads.
        self._rng = np.random.default_rng(seed)
        self._rng_lock = threading.Lock()
        self._metadata = dict(metadata or {})

    def __repr__(self) -> str:
        return (
            f"Policy(config={self._metadata.get('config')!r}, checkpoint={self.checkpoint!r}, "
            f"robot={self._metadata.get('robot')!r}, max_text_tokens={self.max_text_tokens})"
        )

    @property
    def metadata(self) -> dict[str, Any]:
        """What the server sends each client on connect (openpi's policy metadata, plus ours)."""
        return {
            **self._metadata,
            "action_horizon": self.engine.config.action_horizon,
            "num_steps": self.num_steps,
            "language": self.max_text_tokens > 0,
            "max_text_tokens": self.max_text_tokens,
            "temperature": self._temperature,
        }

    @property
    def inline(self) -> InlineRuntime:
        """The engine for one request at a time on the caller's thread, with this policy's steps and
        text budget (`runtime/inline.py`)."""
        return InlineRuntime(self.engine, num_steps=self.num_steps, max_text_tokens=self.max_text_tokens)

    def model_inputs(self, obs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """One raw robot observation -> the canonical unbatched model inputs (`RobotIO.inputs`)."""
        return self.io.inputs(obs)

    def prepare(
        self,
        obs: Mapping[str, Any],
        options: RequestOptions = _DEFAULT_OPTIONS,
        *,
        max_tasks: int | None = None,
    ) -> PreparedRequest:
        """Checks and transforms one raw request (`InvalidRequest` names what is wrong): its options
        (`check_options`), then the robot's input transforms (which check the observation first) and
        tokenizing. max_tasks: the most text tasks it may carry."""
        checked = self.check_options(options, max_tasks=max_tasks)
        guidance = options.guidance
        if isinstance(guidance, ExecutedChunkGuidance):
            unbatched, executed = self.io.inputs_and_actions(obs, guidance.executed)
            guidance = guidance.in_model_space(executed)
        else:
            unbatched = self.model_inputs(obs)
        arrays = {key: np.asarray(value)[None] for key, value in unbatched.items()}
        with self._rng_lock:
            noise_seed, text_seed = (int(s) for s in self._rng.integers(2**31, size=2))
        texts = tuple(
            dataclasses.replace(plan, seed=(text_seed + i) % 2**31) for i, plan in enumerate(checked.texts)
        )
        state = arrays["state"][0]
        return PreparedRequest(arrays, checked.noise, noise_seed, texts, state, guidance, checked.samples)

    def check_options(self, options: RequestOptions, *, max_tasks: int | None = None) -> CheckedOptions:
        """A request's options checked against this policy (`InvalidRequest` for the first that is wrong),
        before any of its observation is transformed: the text budget, sampling, text tasks (each
        instruction tokenized to check its length), samples and noise."""
        budget = self.text_budget(options.prompt_for_text, options.max_text_tokens)
        temperature = self.text_temperature(options.temperature)
        top_p = self.text_top_p(options.top_p)
        tasks = None if options.text_tasks is None else parse_text_tasks(options.text_tasks, max_tasks)
        samples = integer_option(options.samples, "samples")
        if samples is None or not 1 <= samples <= MAX_SAMPLES:
            raise InvalidRequest(f"samples must lie in [1, {MAX_SAMPLES}], got {samples}")
        noise = None if options.noise is None else self.action_noise(options.noise, samples)
        texts: tuple[TextPlan, ...] = ()
        if tasks is not None:
            texts = tuple(
                TextPlan(
                    task.name,
                    tuple(self.task_suffix(task)),
                    self.text_budget(
                        True,
                        options.max_text_tokens if task.max_text_tokens is None else task.max_text_tokens,
                    ),
                    temperature if task.temperature is None else self.text_temperature(task.temperature),
                    top_p,
                    seed=0,
                )
                for task in tasks
            )
            if not budget:
                texts = ()  # no text for this request (max_text_tokens=0 or prompt_for_text=False)
        elif budget:
            texts = (TextPlan(None, (), budget, temperature, top_p, seed=0),)
        return CheckedOptions(texts, samples, noise)

    def finish(
        self,
        prepared: PreparedRequest,
        actions: np.ndarray,
        text: Mapping[str | None, Speech] | None = None,
    ) -> dict[str, Any]:
        """The reply to one request: model actions [H, action_dim] through the robot's output transforms
        (of several chunks [samples, H, action_dim], the densest as the robot executes them,
        `chunk_choice`, its index in `kept_sample`: every path that draws several chunks chooses here),
        and the text of its language requests (task name, None for the prompt's continuation -> speech),
        detokenized where not yet: `text`/`text_tokens`, or `texts`/`texts_tokens` by task name."""
        actions = np.asarray(actions)
        if actions.ndim == 2:
            outputs = self.io.outputs(prepared.state, actions)
        elif len(actions) == 1:
            outputs = self.io.outputs(prepared.state, actions[0])
        else:
            executed = [self.io.outputs(prepared.state, chunk) for chunk in actions]
            kept = chunk_choice.densest(np.stack([each["actions"] for each in executed]))
            outputs = {**executed[kept], "kept_sample": int(kept)}
        if not text:
            return outputs
        said = {
            task: (speech.text if speech.text is not None else self.detokenize(speech.tokens), speech.tokens)
            for task, speech in text.items()
        }
        if None in said:
            outputs["text"], outputs["text_tokens"] = said[None]
        else:
            outputs["texts"] = {task: words for task, (words, _) in said.items()}
            outputs["texts_tokens"] = {task: tokens for task, (_, tokens) in said.items()}
        return outputs

    def infer(self, obs: Mapping[str, Any], **options: Any) -> dict[str, Any]:
        """openpi's `infer`: `prepare` -> the engine -> `finish`, plus `text` and `text_tokens` (or `texts`
        and `texts_tokens` with `text_tasks`) when language is on for this call; options: `RequestOptions`.
        One prefill serves the actions and every language request. `policy_timing`: `infer_ms` until the
        actions are ready, `text_ms` until the text is."""
        prepared = self.prepare(obs, RequestOptions(**options))
        actions, text, timing = self.inline.run(prepared)
        return {**self.finish(prepared, actions, text), "policy_timing": timing}

    def warmup(self, obs: Mapping[str, Any]) -> None:
        """`infer` on `obs`, and its action path once per prompt width the engine may cut a prompt to
        (`engine/prompt_buckets.py`), so no prompt length compiles later."""
        self.infer(obs)
        prepared = self.prepare(obs)
        shape = prepared.arrays["tokenized_prompt_mask"].shape
        for mask in prompt_buckets.filled_masks(shape, self.engine.prompt_buckets):
            arrays = {**prepared.arrays, "tokenized_prompt_mask": mask}
            self.inline.run(dataclasses.replace(prepared, arrays=arrays, texts=()))

    def task_suffix(self, task: TextTask) -> list[int]:
        """The task's instruction tokens, refused (one line) when longer than `MAX_TASK_TOKENS`."""
        suffix = self._tokenizer.tokenize_task(task.instruction)
        if len(suffix) > MAX_TASK_TOKENS:
            raise InvalidRequest(
                f"text task {task.name!r}: instruction is {len(suffix)} tokens, at most {MAX_TASK_TOKENS}"
            )
        return suffix

    def detokenize(self, tokens: np.ndarray) -> str:
        return self._tokenizer.detokenize(tokens)

    def text_temperature(self, temperature: float | None) -> float:
        """This call's sampling temperature (the policy's when None), checked."""
        temperature = number_option(temperature, "temperature")
        temperature = self._temperature if temperature is None else temperature
        if not 0.0 <= temperature <= MAX_TEMPERATURE:
            raise InvalidRequest(f"temperature must lie in [0, {MAX_TEMPERATURE:g}], got {temperature}")
        return temperature

    def text_top_p(self, top_p: float | None) -> float:
        """This call's nucleus mass (the policy's when None), checked."""
        top_p = number_option(top_p, "top_p")
        top_p = self._top_p if top_p is None else top_p
        if not 0.0 < top_p <= 1.0:
            raise InvalidRequest(f"top_p must lie in (0, 1], got {top_p}")
        return top_p

    def text_budget(self, prompt_for_text: bool | None, max_text_tokens: int | None) -> int:
        """New tokens this call may generate (0: no text); the jitted buffer stays `self.max_text_tokens`."""
        if prompt_for_text is False:
            return 0
        budget = integer_option(max_text_tokens, "max_text_tokens")
        budget = self.max_text_tokens if budget is None else budget
        if not 0 <= budget <= self.max_text_tokens:
            raise InvalidRequest(f"max_text_tokens must lie in [0, {self.max_text_tokens}], got {budget}")
        if prompt_for_text and budget == 0:
            raise InvalidRequest("text was asked for, but this policy has language off (max_text_tokens 0)")
        return budget

    def action_noise(self, noise: np.ndarray, samples: int = 1) -> np.ndarray:
        """The request's noise ([H, action_dim] for one sample, or [samples, H, action_dim]) checked, as
        [samples, H, action_dim]."""
        try:
            array = np.asarray(noise)
        except ValueError:  # a ragged list
            raise InvalidRequest("'noise': expected a float array, got a ragged list") from None
        arrays = {"noise": array[None] if array.ndim == 2 else array}
        try:
            return _inputs.noise_from_arrays(arrays, self.engine.config, samples)
        except ValueError as error:  # the request's noise, not the model, is wrong
            raise InvalidRequest(" ".join(str(error).split())) from error


def norm_stats_for(cfg, checkpoint_dir: str | None) -> dict[str, normalization.NormStats] | None:
    """The checkpoint's norm stats for the config's asset id; none (identity) without a checkpoint."""
    if checkpoint_dir is None:
        logger.warning("no checkpoint: identity normalization")
        return None
    stats_file = checkpoints.norm_stats_path(checkpoint_dir, cfg.asset_id)
    logger.info("norm stats from %s", stats_file)
    return normalization.load_norm_stats(stats_file)


def create_policy(
    config_name: str | ml_collections.ConfigDict,
    checkpoint_dir: str | None = None,
    *,
    tokenizer_path: str | None = None,
    max_text_tokens: int = 0,
    default_prompt: str | None = None,
    num_steps: int | None = None,
    params_dtype: str | None = "bfloat16",
    norm_stats: Mapping[str, normalization.NormStats] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Policy:
    """A policy for the config `<config_name>` (or a loaded config; its `robot` picks the transforms) on an
    openpi checkpoint (by default the config's own, e.g. the demo model `pi05_demo` ships; else random).

    Norm stats come from `<checkpoint>/assets/<asset_id>/norm_stats.json` unless given, as openpi's
    `create_trained_policy`, which also restores params as bfloat16: `params_dtype="bfloat16"` replicates
    that (the engine then casts to its compute dtype), "float32" keeps full precision, None the stored
    dtype. `default_prompt` (else the robot's, as openpi's data configs) fills observations without one.
    `overrides` are flattened config fields, e.g. `{"model.discrete_state_input": False}`.
    """
    if isinstance(config_name, str):
        cfg = config.load_config(config_name)
    else:
        cfg = config_name.copy_and_resolve_references()
    if overrides:
        cfg.update_from_flattened_dict(dict(overrides))
    found = robot(cfg)
    checkpoint_dir = config.checkpoint_for(cfg, checkpoint_dir)
    model_config = config.model_config(cfg)
    params = load_params(model_config, checkpoint_dir, seed=cfg.seed, dtype=params_dtype)
    if norm_stats is None:
        norm_stats = norm_stats_for(cfg, checkpoint_dir)
    tokenizer = config.build_tokenizer(cfg, tokenizer_path)
    pipeline = robot_pipeline(cfg, norm_stats, _FittingPrompt(tokenizer), default_prompt=default_prompt)
    return Policy(
        Engine(params, model_config, eos_id=tokenizer.eos_id, mesh=mesh.mesh_from_spec(cfg.engine.mesh)),
        RobotIO(found.raw_spec, pipeline, model_config),
        tokenizer,
        num_steps=num_steps or cfg.num_steps,
        max_text_tokens=max_text_tokens,
        temperature=cfg.engine.temperature,
        top_p=cfg.engine.top_p,
        seed=cfg.seed,
        metadata={
            "config": cfg.name,
            "robot": cfg.robot,
            "action_dim": found.action_dim,
            **rtc_defaults.metadata(cfg),
            **found.metadata,
        },
        checkpoint=checkpoint_dir,
    )
