"""Frames of a LeRobot dataset as train examples: the serving transforms, an action chunk, a text target.

Each frame becomes the raw observation its robot would send (dataset columns renamed by `repack`), its
action chunk (the next `action_horizon` actions of the episode, the last one repeated past its end, as
LeRobot's `delta_timestamps` pad) and the episode's task as the prompt. The robot's own input pipeline
(`policies.policy.robot_pipeline`, the one serving uses) turns it into model-level arrays. With a
subtask column, the frame's subtask text is appended after the prompt (`Tokenizer.tokenize_target`)
and `token_loss_mask` marks those tokens: the language loss is cross-entropy on them, so the model
learns to say the subtask where serving asks it to speak (right after the prompt).

Batches hold the model-level keys of `models.inputs` plus `actions` [B, H, action_dim] and
`token_loss_mask` [B, L]; with a least-clean-prefix column, also `min_clean_prefix` [B] (`training/loss.py`).
"""

import dataclasses
from collections.abc import Iterator, Mapping

import numpy as np
from flax import traverse_util

from oxygen_jax.lerobot.reader import DatasetError, LeRobotDataset, decode_image
from oxygen_jax.models.pi05 import Pi05Config
from oxygen_jax.policies import transforms
from oxygen_jax.policies.robot_io import RawSpec
from oxygen_jax.tokenizer import Tokenizer
from oxygen_jax.training.data.prefetch import prefetch


@dataclasses.dataclass(frozen=True)
class Columns:
    """Which dataset columns feed the robot: `repack` maps raw observation keys (`observation/image`) to
    columns (`observation.image`); `actions` is the action column; `subtask` an optional per-frame text;
    `min_clean_prefix` an optional per-frame count of the chunk's first actions the frame must not teach."""

    repack: Mapping[str, str]
    actions: str = "action"
    subtask: str | None = None
    min_clean_prefix: str | None = None


class FrameSource:
    """Every frame of a dataset as a raw robot observation + `actions` chunk + `prompt` (+ `subtask`).

    Non-image columns are held in memory; stored images stay encoded until a frame is asked for, or, with
    `keep_decoded` (small datasets, e.g. the demo's), are decoded once up front.
    """

    def __init__(
        self, dataset: LeRobotDataset, columns: Columns, action_horizon: int, *, keep_decoded: bool = False
    ) -> None:
        self.dataset = dataset
        self.columns = columns
        self.action_horizon = action_horizon
        names = [*columns.repack.values(), columns.actions, "task_index"]
        names += [name for name in (columns.subtask, columns.min_clean_prefix) if name is not None]
        dataset.require(names)
        self._episodes = [
            dataset.read_episode(e, dict.fromkeys(names), decode_images=keep_decoded)
            for e in dataset.episodes
        ]
        self._index = [(e, t) for e, episode in enumerate(dataset.episodes) for t in range(episode.length)]
        for e, episode in enumerate(self._episodes):
            if np.asarray(episode[columns.actions]).ndim != 2:
                raise DatasetError(
                    f"{dataset.root}: episode {dataset.episodes[e].index} column {columns.actions!r} is not "
                    "one action vector per frame"
                )

    def __len__(self) -> int:
        return len(self._index)

    def frame(self, i: int) -> dict:
        e, t = self._index[i]
        episode = self._episodes[e]
        raw = {}
        for key, column in self.columns.repack.items():
            value = episode[column][t]
            if self.dataset.features[column]["dtype"] == "image" and not isinstance(value, np.ndarray):
                value = decode_image(value, self.dataset.root)
            raw[key] = value
        actions = np.asarray(episode[self.columns.actions])
        steps = np.minimum(np.arange(t, t + self.action_horizon), len(actions) - 1)
        raw["actions"] = actions[steps]
        task_index = int(episode["task_index"][t])
        if task_index not in self.dataset.tasks:
            raise DatasetError(f"{self.dataset.root}: task_index {task_index} is not in meta/tasks.jsonl")
        raw["prompt"] = self.dataset.tasks[task_index]
        if self.columns.subtask is not None:
            raw["subtask"] = str(episode[self.columns.subtask][t])
        if self.columns.min_clean_prefix is not None:
            raw["min_clean_prefix"] = int(np.asarray(episode[self.columns.min_clean_prefix][t]).reshape(()))
        return raw


def append_target(
    ids: np.ndarray, mask: np.ndarray, target: list[int]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ids, mask, token_loss_mask) with `target` written after the prompt's valid tokens; a one-line
    error when prompt and target do not fit in the token length."""
    start, length = int(mask.sum()), len(mask)
    if start + len(target) > length:
        raise ValueError(
            f"prompt ({start} tokens) + subtask ({len(target)} tokens) exceed max_token_len {length}"
        )
    ids, mask, loss_mask = ids.copy(), mask.copy(), np.zeros(length, bool)
    ids[start : start + len(target)] = target
    mask[start : start + len(target)] = True
    loss_mask[start : start + len(target)] = True
    return ids, mask, loss_mask


class TrainExamples:
    """Model-level train examples of a `FrameSource` through a robot pipeline (normalization included).

    With the robot's `RawSpec`, "/"-joined column keys of nested observations (ALOHA's `images/cam_high`,
    as the evaluation CLIs record them) are nested again before the transforms."""

    def __init__(
        self,
        source: FrameSource,
        pipeline: transforms.Pipeline,
        tokenizer: Tokenizer,
        config: Pi05Config,
        raw_spec: RawSpec | None = None,
    ) -> None:
        self.source = source
        self.pipeline = pipeline
        self.tokenizer = tokenizer
        self.config = config
        self.raw_spec = raw_spec

    def __len__(self) -> int:
        return len(self.source)

    def robot_data(self, i: int) -> dict:
        """Frame `i` after the robot transforms only (what norm stats are computed on)."""
        raw, _, _ = self._raw(i)
        return self.pipeline.data_inputs(raw)

    def _raw(self, i: int) -> tuple[dict, str | None, int | None]:
        """Frame `i` as the raw observation its robot sends (with `actions`), its subtask text and its least
        clean prefix."""
        raw = self.source.frame(i)
        subtask = raw.pop("subtask", None)
        min_clean_prefix = raw.pop("min_clean_prefix", None)
        return (self.raw_spec.nested(raw) if self.raw_spec else raw), subtask, min_clean_prefix

    def example(self, i: int, *, with_text: bool = True) -> dict[str, np.ndarray]:
        """Frame `i` as model-level arrays; `with_text` appends its subtask (when the data has one)."""
        raw, subtask, min_clean_prefix = self._raw(i)
        data = traverse_util.flatten_dict(self.pipeline.inputs(raw), sep="/")
        out = {key: np.asarray(data[key]) for key in _model_keys(self.config)}
        ids, mask = out["tokenized_prompt"].astype(np.int32), out["tokenized_prompt_mask"].astype(bool)
        loss_mask = np.zeros_like(mask)
        if with_text and subtask:
            ids, mask, loss_mask = append_target(ids, mask, self.tokenizer.tokenize_target(subtask))
        actions = np.asarray(out["actions"], np.float32)
        expected = (self.config.action_horizon, self.config.action_dim)
        if actions.shape != expected:
            raise DatasetError(
                f"frame {i}: actions {list(actions.shape)} after the transforms, expected {list(expected)}"
            )
        return {
            **out,
            "tokenized_prompt": ids,
            "tokenized_prompt_mask": mask,
            "token_loss_mask": loss_mask,
            "state": np.asarray(out["state"], np.float32),
            "actions": actions,
            **({} if min_clean_prefix is None else {"min_clean_prefix": np.int32(min_clean_prefix)}),
        }

    def batches(
        self, batch_size: int, *, seed: int = 0, text_fraction: float = 1.0, prefetch_batches: int = 2
    ) -> Iterator[dict]:
        """Endless shuffled batches (a new permutation per epoch), made `prefetch_batches` ahead on a
        background thread (0: in the caller's). `text_fraction` of the examples carry their subtask; the
        rest train the actions on the prompt alone, the prefix serving acts from."""
        made = self._batches(batch_size, seed, text_fraction)
        return prefetch(made, prefetch_batches) if prefetch_batches else made

    def _batches(self, batch_size: int, seed: int, text_fraction: float) -> Iterator[dict]:
        rng = np.random.default_rng(seed)
        order = np.empty(0, int)
        while True:
            while len(order) < batch_size:
                order = np.concatenate([order, rng.permutation(len(self))])
            chosen, order = order[:batch_size], order[batch_size:]
            texts = rng.random(batch_size) < text_fraction
            examples = [self.example(int(i), with_text=bool(t)) for i, t in zip(chosen, texts, strict=True)]
            yield {key: np.stack([e[key] for e in examples]) for key in examples[0]}


def _model_keys(config: Pi05Config) -> list[str]:
    keys = ["state", "tokenized_prompt", "tokenized_prompt_mask", "actions"]
    for cam in config.image_keys:
        keys += [f"image/{cam}", f"image_mask/{cam}"]
    return keys
