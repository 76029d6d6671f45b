"""Shared pieces of the absl command-line tools: `--config=<name>` resolution and engine building."""

import sys

from absl import flags, logging
from ml_collections import config_flags

from oxygen_jax import checkpoints, config
from oxygen_jax.engine.engine import Engine
from oxygen_jax.models import pi05
from oxygen_jax.tokenizer import Tokenizer


def define_config_flag(default: str) -> flags.FlagHolder:
    """`--config=pi05_tiny` (a name under configs/) or a path; `--config.model.x=...` overrides."""
    return config_flags.DEFINE_config_file("config", config.config_path(default), "Config name or file.")


def parse_flags(argv: list[str]) -> list[str]:
    """absl flags parser that maps `--config=<name>` to `configs/<name>.py` before parsing."""
    rewritten = [
        "--config=" + config.config_path(arg.split("=", 1)[1]) if arg.startswith("--config=") else arg
        for arg in argv
    ]
    return flags.FLAGS(rewritten)


def build_engine(cfg, checkpoint_dir: str | None, seed: int = 0) -> Engine:
    """An engine on an openpi checkpoint, or on a random-initialized model when none is given."""
    model_config = config.model_config(cfg)
    if checkpoint_dir:
        params = checkpoints.restore_params(checkpoint_dir, expected=pi05.param_shapes(model_config))
        logging.info("restored params from %s", checkpoint_dir)
    else:
        import jax

        logging.info("no --checkpoint_dir: random-initialized %s (seed %d)", cfg.name, seed)
        params = pi05.init_params(model_config, jax.random.key(seed))
    return Engine(params, model_config)


def build_tokenizer(cfg, tokenizer_path: str | None = None) -> Tokenizer:
    return Tokenizer(tokenizer_path or cfg.tokenizer_path, max_len=cfg.model.max_token_len)


def fail(message: str) -> None:
    """Ends a CLI with a one-line error instead of a traceback for user mistakes."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)
