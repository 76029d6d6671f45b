"""Real-time chunking toward what the robot executes, expressed in the new request's model space.

A delta-action robot's model chunk (openpi's `aloha` joints) is relative to the state it was planned
from, so the previous chunk in model space is the wrong guidance target for a request from a newer state.
What stays valid is the chunk as the robot executes it (the reply's `actions`, absolute). `Policy.prepare`
runs it through the new request's input transforms with the new state, as training makes its targets
(absolute -> delta on the delta dims -> normalized -> padded), and guides toward the result. For
absolute-action robots the result is the old model chunk again (to float rounding).
"""

import dataclasses

import numpy as np

from oxygen_jax.engine.api import ChunkGuidance


@dataclasses.dataclass(frozen=True)
class ExecutedChunkGuidance:
    """`planned`: the engine's guidance, its prev_chunk the old chunk aligned [H, action_dim] in the model
    space it was planned in; `executed`: the same aligned chunk as the robot executes it [H, robot dims]."""

    planned: ChunkGuidance
    executed: np.ndarray

    def in_model_space(self, executed_as_model: np.ndarray) -> ChunkGuidance:
        """`planned` with its target's robot dims replaced by `executed_as_model` ([H, action_dim]:
        `executed` through the new request's input transforms). Every robot's transforms map its action
        dims to the model's leading ones; the model dims past them are dropped by the output transforms
        (not invertible) and keep the old chunk's values, which involve no state."""
        dims = np.shape(self.executed)[-1]
        target = np.array(self.planned.prev_chunk, np.float32)
        target[:, :dims] = np.asarray(executed_as_model)[:, :dims]
        return dataclasses.replace(self.planned, prev_chunk=target)
