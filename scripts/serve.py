"""Serve a pi0.5 policy to openpi clients over websocket: actions, and language from the same prefill.

  python scripts/serve.py --env=libero --checkpoint_dir=pi05_libero --max_text_tokens=24
  python scripts/serve.py --config=pi05_tiny --checkpoint_dir=../shared/golden/checkpoint --port=8001

`--env` picks the config `pi05_<env>` unless `--config` is given; `--config.x=...` overrides apply either
way. Without `--checkpoint_dir` the model is random-initialized (for smoke tests only).
"""

from absl import app, flags, logging
from ml_collections import config_flags

from oxygen_jax import cli
from oxygen_jax.policies.policy import PARAMS_DTYPES, create_policy
from oxygen_jax.serving import websocket_server
from oxygen_jax.serving.policy_backend import PolicyServerBackend

_ENV = flags.DEFINE_enum("env", "libero", ["libero", "droid", "aloha"], "Robot; picks config pi05_<env>.")
_CONFIG = cli.define_config_flag("pi05_libero")
_CHECKPOINT = flags.DEFINE_string("checkpoint_dir", None, "openpi checkpoint (random init when absent).")
_TOKENIZER = flags.DEFINE_string("tokenizer_path", None, "PaliGemma sentencepiece model (see README).")
_PORT = flags.DEFINE_integer("port", 8000, "Port to serve on.")
_HOST = flags.DEFINE_string("host", "0.0.0.0", "Interface to bind.")
_MAX_TEXT = flags.DEFINE_integer("max_text_tokens", 0, "Text tokens per reply at most (0: actions only).")
_PROMPT = flags.DEFINE_string("default_prompt", None, "Prompt for observations that carry none.")
_PARAMS_DTYPE = flags.DEFINE_enum(
    "params_dtype", "bfloat16", list(PARAMS_DTYPES), "Restore params as this dtype (openpi: bfloat16)."
)


def main(_):
    config_flag = flags.FLAGS[_CONFIG.name]
    name = config_flags.get_config_filename(config_flag) if config_flag.present else f"pi05_{_ENV.value}"
    try:
        policy = create_policy(
            name,
            _CHECKPOINT.value,
            tokenizer_path=_TOKENIZER.value,
            max_text_tokens=_MAX_TEXT.value,
            default_prompt=_PROMPT.value,
            params_dtype=_PARAMS_DTYPE.value,
            overrides=config_flags.get_override_values(config_flag),
        )
    except (FileNotFoundError, ValueError) as error:
        cli.fail(str(error))
    logging.info("policy metadata: %s", policy.metadata)
    websocket_server.serve(PolicyServerBackend(policy), _HOST.value, _PORT.value)


if __name__ == "__main__":
    app.run(main, flags_parser=cli.parse_flags)
