"""Shared pieces of the absl command-line tools: `--config=<name>` resolution and engine building."""

import sys

from absl import flags
from ml_collections import config_flags

from oxygen_jax import config
from oxygen_jax.engine.engine import Engine
from oxygen_jax.params import load_params
from oxygen_jax.tokenizer import Tokenizer


def define_config_flag(default: str) -> flags.FlagHolder:
    """`--config=pi05_tiny` (a name under oxygen_jax/configs/) or a path; `--config.model.x=...` overrides."""
    return config_flags.DEFINE_config_file("config", config.config_path(default), "Config name or file.")


def parse_flags(argv: list[str]) -> list[str]:
    """absl flags parser that maps `--config=<name>` to its file in oxygen_jax/configs/ before parsing."""
    rewritten = [
        "--config=" + config.config_path(arg.split("=", 1)[1]) if arg.startswith("--config=") else arg
        for arg in argv
    ]
    return flags.FLAGS(rewritten)


def build_engine(cfg, checkpoint_dir: str | None, seed: int = 0, params_dtype: str | None = None) -> Engine:
    """An engine on an openpi checkpoint (the config's own when none is given), or on a random-initialized
    model when neither exists."""
    model_config = config.model_config(cfg)
    params = load_params(
        model_config, config.checkpoint_for(cfg, checkpoint_dir), seed=seed, dtype=params_dtype
    )
    return Engine(params, model_config)


def build_tokenizer(cfg, tokenizer_path: str | None = None) -> Tokenizer:
    return Tokenizer(tokenizer_path or cfg.tokenizer_path, max_len=cfg.model.max_token_len)


def fail(message: str) -> None:
    """Ends a CLI with a one-line error instead of a traceback for user mistakes."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)
