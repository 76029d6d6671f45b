"""A robot policy: the engine, one robot's transforms and the tokenizer, behind openpi's `infer(obs)`.

Drop-in for openpi's `Policy`: one unbatched raw observation in, robot-space `actions` [H, robot dims]
and `policy_timing` out. With language on, `text` comes from the same prefill as the actions
(`Engine.act_and_speak`), so speaking never costs a second pass over the images.
"""

import dataclasses
import functools
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from oxygen_jax import checkpoints, config
from oxygen_jax.engine import mesh
from oxygen_jax.engine.engine import Engine
from oxygen_jax.errors import ConfigError, InvalidRequest
from oxygen_jax.models import inputs as _inputs
from oxygen_jax.params import load_params
from oxygen_jax.policies import aloha, droid, libero, normalization, table, transforms
from oxygen_jax.policies.robot_io import RawSpec, RobotIO
from oxygen_jax.policies.text_tasks import TextTask, parse_text_tasks
from oxygen_jax.tokenizer import Tokenizer

logger = logging.getLogger(__name__)

# Sampling at a higher temperature is indistinguishable from uniform over the vocabulary.
MAX_TEMPERATURE = 100.0

# A text task's instruction tokens (its suffix on the shared prefix; one compiled shape).
MAX_TASK_TOKENS = 32


@dataclasses.dataclass(frozen=True)
class PlannedTask:
    """One checked text task: its instruction's tokens (the suffix on the shared prefix) and options."""

    name: str
    suffix: list[int]
    max_new_tokens: int
    temperature: float


@dataclasses.dataclass(frozen=True)
class _Robot:
    make_pipeline: Callable[..., transforms.Pipeline]
    raw_spec: RawSpec
    action_dim: int
    metadata: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    # The prompt of observations that carry none (openpi's data config `default_prompt`).
    default_prompt: str | None = None


_ROBOTS = {
    "libero": _Robot(libero.make_libero_pipeline, libero.RAW_SPEC, libero.ACTION_DIM),
    "droid": _Robot(droid.make_droid_pipeline, droid.RAW_SPEC, droid.ACTION_DIM),
    # openpi's pi05_aloha policy metadata: the arm pose clients reset to.
    "aloha": _Robot(
        aloha.make_aloha_pipeline, aloha.RAW_SPEC, aloha.ACTION_DIM, {"reset_pose": [0, -1.5, 1.5, 0, 0, 0]}
    ),
    # openpi's ALOHA sim data (pi0_aloha_sim): absolute joint actions and the one task's prompt.
    "aloha_sim": _Robot(
        functools.partial(aloha.make_aloha_pipeline, use_delta_joint_actions=False),
        aloha.RAW_SPEC,
        aloha.ACTION_DIM,
        default_prompt="Transfer cube",
    ),
    "table": _Robot(table.make_table_pipeline, table.RAW_SPEC, table.ACTION_DIM),
}


def robot(cfg) -> _Robot:
    """The robot a config names (`cfg.robot`), or a one-line error listing the known ones."""
    found = _ROBOTS.get(cfg.get("robot"))
    if found is None:
        raise ConfigError(
            f"config {cfg.name!r} has robot {cfg.get('robot')!r}; a policy needs one of {sorted(_ROBOTS)}"
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
    on such prompts. The wrapped tokenizer is one token longer, to tell "fits exactly" from "was cut"."""

    tokenizer: Tokenizer

    def tokenize(self, prompt: str, state: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        ids, mask = self.tokenizer.tokenize(prompt, state)
        if mask[-1] and (state is None or self.tokenizer.tokenize(prompt, None)[1][-1]):
            raise InvalidRequest(f"prompt too long: it does not fit in max_token_len {len(mask) - 1} tokens")
        return ids[:-1], mask[:-1]


class Policy:
    """Engine + robot I/O + tokenizer. Not thread-safe: serve it from one thread at a time."""

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
    ) -> None:
        self.engine = engine
        self.num_steps = num_steps
        self.max_text_tokens = max_text_tokens
        self.io = io
        self._tokenizer = tokenizer
        self._temperature = temperature
        self._top_p = top_p
        # Per-call seeds for the noise and the text sampler, reproducible from `seed`.
        self._rng = np.random.default_rng(seed)
        self._metadata = dict(metadata or {})

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

    def model_inputs(self, obs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """One raw robot observation -> the canonical unbatched model inputs (`RobotIO.inputs`)."""
        return self.io.inputs(obs)

    def infer(
        self,
        obs: Mapping[str, Any],
        *,
        noise: np.ndarray | None = None,
        prompt_for_text: bool | None = None,
        max_text_tokens: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        text_tasks: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None,
    ) -> dict[str, Any]:
        """openpi's `infer`, plus `text` and `text_tokens` when language is on for this call.

        text_tasks: several named language tasks on this observation (see `policies.text_tasks`), each
        its instruction appended to the shared prefix (`Engine.extend`); the reply then carries `texts`
        (name -> text) and `texts_tokens` (name -> tokens) instead of `text`. One prefill serves the
        actions and every task; per-task `max_text_tokens`/`temperature` default to this call's.

        noise: [H, action_dim] (or [1, H, action_dim]) makes the action sample deterministic.
        prompt_for_text: ask for text (None: iff the policy's `max_text_tokens` > 0; False: actions only).
        max_text_tokens, temperature, top_p: this call's text budget (at most the policy's) and sampling.
        `policy_timing`: `infer_ms` until the actions are ready, `text_ms` until the text is.
        """
        if text_tasks is not None:
            return self._infer_tasks(obs, noise, text_tasks, max_text_tokens, temperature, top_p)
        budget = self.text_budget(prompt_for_text, max_text_tokens)
        temperature = self.text_temperature(temperature)
        top_p = self.text_top_p(top_p)
        arrays, observation, noise, text_seed = self._prepare(obs, noise)

        start = time.monotonic()
        text = None
        if budget:
            actions, text = self.engine.act_and_speak(
                observation,
                noise,
                self.num_steps,
                self.max_text_tokens,
                temperature=temperature,
                top_p=top_p,
                max_new=budget,
                seed=text_seed,
            )
        else:
            actions = self.engine.denoise(self.engine.prefill(observation), noise, self.num_steps)
        timing = {"infer_ms": (time.monotonic() - start) * 1000}
        outputs = self.robot_outputs(arrays["state"], np.asarray(actions[0]))
        if text is not None:
            tokens = np.asarray(text.tokens[0, : int(text.lengths[0])], np.int32)
            timing["text_ms"] = (time.monotonic() - start) * 1000
            outputs["text"] = self.detokenize(tokens)
            outputs["text_tokens"] = tokens
        outputs["policy_timing"] = timing
        return outputs

    def _prepare(self, obs: Mapping[str, Any], noise: np.ndarray | None):
        """(model-level arrays, batch-1 Observation, action noise, text seed) of one raw observation."""
        arrays = self.model_inputs(obs)
        observation = _inputs.observation_from_arrays(
            {key: np.asarray(value)[None] for key, value in arrays.items()}, self.engine.config
        )
        noise_seed, text_seed = (int(s) for s in self._rng.integers(2**31, size=2))
        return arrays, observation, self.action_noise(noise, noise_seed), text_seed

    def task_suffix(self, task: TextTask) -> list[int]:
        """The task's instruction tokens, refused (one line) when longer than `MAX_TASK_TOKENS`."""
        suffix = self._tokenizer.tokenize_task(task.instruction)
        if len(suffix) > MAX_TASK_TOKENS:
            raise InvalidRequest(
                f"text task {task.name!r}: instruction is {len(suffix)} tokens, at most {MAX_TASK_TOKENS}"
            )
        return suffix

    def plan_text_tasks(
        self, text_tasks: Any, max_text_tokens: int | None, temperature: float | None
    ) -> list[PlannedTask]:
        """A request's `text_tasks` checked: per task its name, instruction suffix, token budget and
        temperature (the call's `max_text_tokens` / `temperature` where the task sets none)."""
        default_temperature = self.text_temperature(temperature)
        return [
            PlannedTask(
                task.name,
                self.task_suffix(task),
                self.text_budget(
                    True, max_text_tokens if task.max_text_tokens is None else task.max_text_tokens
                ),
                default_temperature if task.temperature is None else self.text_temperature(task.temperature),
            )
            for task in parse_text_tasks(text_tasks)
        ]

    def _infer_tasks(self, obs, noise, text_tasks, max_text_tokens, temperature, top_p) -> dict[str, Any]:
        """Actions and one text per task, from one prefill plus one extension call."""
        tasks = self.plan_text_tasks(text_tasks, max_text_tokens, temperature)
        budgets = [task.max_new_tokens for task in tasks]
        temps = [task.temperature for task in tasks]
        suffixes = [task.suffix for task in tasks]
        arrays, observation, noise, text_seed = self._prepare(obs, noise)

        start = time.monotonic()
        cache = self.engine.prefill(observation)
        actions = self.engine.denoise(cache, noise, self.num_steps)
        outputs = self.robot_outputs(arrays["state"], np.asarray(actions[0]))
        timing = {"infer_ms": (time.monotonic() - start) * 1000}
        extended = self.engine.extend(cache, np.zeros(len(tasks), np.int32), suffixes, MAX_TASK_TOKENS)
        pad = extended.mask.shape[0] - len(tasks)
        text = self.engine.generate(
            extended,
            self.max_text_tokens,
            temperature=np.array(temps + [0.0] * pad, np.float32),
            top_p=self.text_top_p(top_p),
            max_new=np.array(budgets + [1] * pad, np.int32),
            seed=text_seed,
        )
        tokens, lengths = np.asarray(text.tokens), np.asarray(text.lengths)
        by_task = {t.name: tokens[i, : lengths[i]].astype(np.int32) for i, t in enumerate(tasks)}
        timing["text_ms"] = (time.monotonic() - start) * 1000
        outputs["texts"] = {name: self.detokenize(ids) for name, ids in by_task.items()}
        outputs["texts_tokens"] = by_task
        outputs["policy_timing"] = timing
        return outputs

    def robot_outputs(self, state: np.ndarray, actions: np.ndarray) -> dict[str, Any]:
        """Model actions [H, action_dim] -> the robot's outputs (`RobotIO.outputs`)."""
        return self.io.outputs(state, actions)

    def detokenize(self, tokens: np.ndarray) -> str:
        return self._tokenizer.detokenize(tokens)

    def text_temperature(self, temperature: float | None) -> float:
        """This call's sampling temperature (the policy's when None), checked."""
        temperature = self._temperature if temperature is None else float(temperature)
        if not 0.0 <= temperature <= MAX_TEMPERATURE:
            raise InvalidRequest(f"temperature must lie in [0, {MAX_TEMPERATURE:g}], got {temperature}")
        return temperature

    def text_top_p(self, top_p: float | None) -> float:
        """This call's nucleus mass (the policy's when None), checked."""
        top_p = self._top_p if top_p is None else float(top_p)
        if not 0.0 < top_p <= 1.0:
            raise InvalidRequest(f"top_p must lie in (0, 1], got {top_p}")
        return top_p

    def text_budget(self, prompt_for_text: bool | None, max_text_tokens: int | None) -> int:
        """New tokens this call may generate (0: no text); the jitted buffer stays `self.max_text_tokens`."""
        if prompt_for_text is False:
            return 0
        budget = self.max_text_tokens if max_text_tokens is None else int(max_text_tokens)
        if not 0 <= budget <= self.max_text_tokens:
            raise InvalidRequest(f"max_text_tokens must lie in [0, {self.max_text_tokens}], got {budget}")
        if prompt_for_text and budget == 0:
            raise InvalidRequest("text was asked for, but this policy has language off (max_text_tokens 0)")
        return budget

    def action_noise(self, noise: np.ndarray | None, seed: int) -> jax.Array:
        """The given noise ([H, action_dim] or [1, H, action_dim]) checked, or a fresh draw from `seed`."""
        if noise is None:
            return self.engine.noise(jax.random.key(seed), 1)
        noise = np.asarray(noise)
        arrays = {"noise": noise[None] if noise.ndim == 2 else noise}
        try:
            return jnp.asarray(_inputs.noise_from_arrays(arrays, self.engine.config, 1))
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
    checkpoint_dir: str | None,
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
    openpi checkpoint.

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
    tokenizer = Tokenizer(tokenizer_path or cfg.tokenizer_path, max_len=model_config.max_token_len + 1)
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
        metadata={"config": cfg.name, "robot": cfg.robot, "action_dim": found.action_dim, **found.metadata},
    )
