"""How a model runs real-time chunking unless told otherwise, as its config says.

The method follows from training: a model trained with a clean prefix (`model.max_clean_prefix` > 0)
conditions on the executed actions, any other is guided (docs/rtc.md). `rtc.samples` is how many chunks a
request that continues none (a robot's first) draws, keeping the one inside the motion most of them took:
the setting measured best for the model. The policy carries both in its metadata, so the tools,
`LocalRobot` and the server's clients see which method runs.
"""

from collections.abc import Mapping
from typing import Any


def method(max_clean_prefix: int) -> str:
    """The method: conditioned for a model trained with a clean prefix, else guided."""
    return "conditioned" if max_clean_prefix else "guided"


def metadata(cfg: Any) -> dict[str, Any]:
    """The policy metadata fields of a config: `rtc_method` and `rtc_samples`."""
    return {"rtc_method": method(cfg.model.max_clean_prefix), "rtc_samples": int(cfg.rtc.samples)}


def samples(policy_metadata: Mapping[str, Any]) -> int:
    """The chunks a request without `rtc` draws by default (1 for a policy built without a config)."""
    return int(policy_metadata.get("rtc_samples", 1))
