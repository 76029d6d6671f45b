"""The command-line layer every script shares: one flag name and one default per idea, `--config=<name>`
resolution, and `run(main)`, which reports user mistakes in one line instead of a traceback.

Flags defined here are listed by each script's `--help` (absl shows only the main module's own flags
unless told otherwise).
"""

import dataclasses
import logging
import os
import sys
from collections.abc import Callable
from typing import Any

import jax
from absl import app, flags
from ml_collections import config_flags

from oxygen_jax import config, preflight
from oxygen_jax.engine import mesh
from oxygen_jax.engine.engine import Engine
from oxygen_jax.errors import UserError
from oxygen_jax.params import PARAMS_DTYPES, load_params

STORED = "stored"
# absl's `--verbosity` value for WARNING (0 is INFO, 1 DEBUG).
_QUIET = -1
_CHECKPOINT_HELP = "openpi checkpoint: a path, an openpi cache name or a gs:// URL (random init if absent)."


def _shown(holder: flags.FlagHolder) -> flags.FlagHolder:
    """Lists a flag defined here in the running script's `--help`."""
    flags.FLAGS.register_key_flag_for_module(sys.argv[0], flags.FLAGS[holder.name])
    return holder


def _env_int(name: str) -> int | None:
    value = os.environ.get(name)
    return int(value) if value else None


def define_config_flag(default: str) -> flags.FlagHolder:
    """`--config=pi05_tiny` (a name under oxygen_jax/configs/) or a path; `--config.model.x=...` overrides."""
    return _shown(
        config_flags.DEFINE_config_file(
            "config",
            config.config_path(default),
            f"Config name ({', '.join(config.known_configs())}) or file.",
        )
    )


@dataclasses.dataclass(frozen=True)
class ModelFlags:
    """The flags that pick a model: config, checkpoint, tokenizer, params dtype, denoising steps."""

    config: flags.FlagHolder
    checkpoint_dir: flags.FlagHolder
    tokenizer_path: flags.FlagHolder
    params_dtype: flags.FlagHolder
    num_steps: flags.FlagHolder

    def params_dtype_value(self) -> str | None:
        """The dtype to restore params as (None: as stored)."""
        return params_dtype_value(self.params_dtype)

    def config_name(self) -> str:
        """The `--config` file (for APIs that load a config by name or path)."""
        return config_flags.get_config_filename(flags.FLAGS[self.config.name])

    def config_overrides(self) -> dict[str, Any]:
        """The `--config.x=...` overrides, flattened, with `--mesh` as engine.mesh (APIs that load the
        config by name apply these, so the mesh must be among them)."""
        overrides = config_flags.get_override_values(flags.FLAGS[self.config.name])
        return {**overrides, "engine.mesh": MESH.value} if MESH.value else overrides

    def preflight(self, *, needs_tokenizer: bool = True) -> None:
        """Checks, before the model loads, that its checkpoint (and tokenizer) are there."""
        preflight.model(
            self.config.value,
            self.checkpoint_dir.value,
            self.tokenizer_path.value,
            needs_tokenizer=needs_tokenizer,
        )


def params_dtype_value(holder: flags.FlagHolder) -> str | None:
    """`--params_dtype` as `load_params` takes it (None: as stored)."""
    return None if holder.value == STORED else holder.value


def define_checkpoint_dir_flag(checkpoint_help: str | None = None) -> flags.FlagHolder:
    return _shown(flags.DEFINE_string("checkpoint_dir", None, checkpoint_help or _CHECKPOINT_HELP))


def define_tokenizer_path_flag() -> flags.FlagHolder:
    return _shown(
        flags.DEFINE_string("tokenizer_path", None, "PaliGemma sentencepiece model (config's when absent).")
    )


def define_params_dtype_flag(default: str = "bfloat16") -> flags.FlagHolder:
    """`--params_dtype`: bfloat16 by default as openpi restores for inference (training: float32)."""
    return _shown(
        flags.DEFINE_enum(
            "params_dtype",
            default,
            [*PARAMS_DTYPES, STORED],
            "Restore params as this dtype (openpi: bfloat16); the model computes in the config's dtype.",
        )
    )


def define_model_flags(default_config: str, checkpoint_help: str | None = None) -> ModelFlags:
    return ModelFlags(
        config=define_config_flag(default_config),
        checkpoint_dir=define_checkpoint_dir_flag(checkpoint_help),
        tokenizer_path=define_tokenizer_path_flag(),
        params_dtype=define_params_dtype_flag(),
        num_steps=_shown(
            flags.DEFINE_integer("num_steps", None, "Denoising steps (config's when absent).", lower_bound=1)
        ),
    )


def define_max_text_tokens() -> flags.FlagHolder:
    return _shown(
        flags.DEFINE_integer(
            "max_text_tokens",
            None,
            "Text tokens per language request (config's engine.max_new_tokens when absent; 0: actions only).",
            lower_bound=0,
        )
    )


def max_text_tokens(holder: flags.FlagHolder, cfg) -> int:
    """`--max_text_tokens`, or the config's `engine.max_new_tokens` when it is absent."""
    return cfg.engine.max_new_tokens if holder.value is None else holder.value


@dataclasses.dataclass(frozen=True)
class DecodeStepFlags:
    """How many decode steps run per frame: `--k`, or as many as `--target_hz` leaves time for."""

    k: flags.FlagHolder
    target_hz: flags.FlagHolder


def define_decode_step_flags() -> DecodeStepFlags:
    return DecodeStepFlags(
        k=_shown(flags.DEFINE_integer("k", 5, "Decode steps per frame (unless --target_hz).", lower_bound=1)),
        target_hz=_shown(
            flags.DEFINE_float(
                "target_hz", None, "Frame rate to hold; k is chosen online per frame.", lower_bound=1e-3
            )
        ),
    )


@dataclasses.dataclass(frozen=True)
class PolicyFlags:
    """The evaluation scripts' policy: in-process (`--policy=local`) or an oxygen-serve server."""

    kind: flags.FlagHolder
    host: flags.FlagHolder
    port: flags.FlagHolder
    model: ModelFlags
    max_text_tokens: flags.FlagHolder
    record_dir: flags.FlagHolder

    def settings(self) -> dict[str, Any]:
        """Keyword arguments of `evaluation.policies.policy_for`."""
        model = self.model
        return {
            "kind": self.kind.value,
            "host": self.host.value,
            "port": self.port.value,
            "config_name": model.config_name(),
            "checkpoint_dir": model.checkpoint_dir.value,
            "overrides": model.config_overrides(),
            "max_text_tokens": max_text_tokens(self.max_text_tokens, model.config.value),
            "tokenizer_path": model.tokenizer_path.value,
            "num_steps": model.num_steps.value,
            "params_dtype": model.params_dtype_value(),
        }

    def preflight(self, out: str | None) -> None:
        """Checks, before the policy loads, what a local one reads and that `out` can be written."""
        if self.kind.value == "local":
            self.model.preflight()
        if out:
            preflight.writable(out, folder=True)

    def description(self) -> dict[str, Any]:
        """How the policy was chosen, for the results file."""
        if self.kind.value == "remote":
            return {"kind": "remote", "host": self.host.value, "port": self.port.value}
        return {
            "kind": "local",
            "config": self.model.config.value.name,
            "checkpoint_dir": self.model.checkpoint_dir.value,
            "max_text_tokens": max_text_tokens(self.max_text_tokens, self.model.config.value),
        }


def define_remote_flags() -> tuple[flags.FlagHolder, flags.FlagHolder]:
    """--host and --port: where a client finds the server of --policy=remote."""
    return (
        _shown(flags.DEFINE_string("host", "127.0.0.1", "Policy server host for --policy=remote.")),
        _shown(flags.DEFINE_integer("port", 8000, "Policy server port for --policy=remote.")),
    )


def define_policy_flags(default_config: str) -> PolicyFlags:
    kind = _shown(
        flags.DEFINE_enum(
            "policy", "local", ["local", "remote"], "In-process policy, or an oxygen-serve server."
        )
    )
    host, port = define_remote_flags()
    return PolicyFlags(
        kind=kind,
        host=host,
        port=port,
        model=define_model_flags(default_config),
        max_text_tokens=define_max_text_tokens(),
        record_dir=_shown(
            flags.DEFINE_string(
                "record_dir",
                None,
                "Record every control step (observation, executed action, the policy's text) as a LeRobot "
                "dataset in this new folder (docs/training.md).",
            )
        ),
    )


def renamed(new: flags.FlagHolder, old: flags.FlagHolder) -> Any:
    """The value of flag `new`, or of `old`, its deprecated former name, with a one-line warning."""
    if not old.present:
        return new.value
    if new.present:
        fail(f"give --{new.name} only (--{old.name} is its deprecated name)")
    print(f"warning: --{old.name} is deprecated here: use --{new.name}", file=sys.stderr)
    return old.value


@dataclasses.dataclass(frozen=True)
class ClosedLoopGuidanceFlags:
    """The closed-loop evaluations' rtc settings (`robots.trial.GuidanceSettings`' fields, in order)."""

    schedule: flags.FlagHolder
    max_guidance_weight: flags.FlagHolder
    prefix_horizon: flags.FlagHolder
    noise_dims: flags.FlagHolder
    fresh_samples: flags.FlagHolder

    def values(self) -> tuple[str, float, int | None, int | None, int | None]:
        return (
            self.schedule.value,
            self.max_guidance_weight.value,
            self.prefix_horizon.value,
            self.noise_dims.value,
            self.fresh_samples.value,
        )


def define_closed_loop_guidance_flags() -> ClosedLoopGuidanceFlags:
    from oxygen_jax.engine.guidance import SCHEDULES

    return ClosedLoopGuidanceFlags(
        schedule=_shown(
            flags.DEFINE_enum(
                "rtc_schedule", "exp", SCHEDULES, "rtc: how the prefix weights fall over [d, s)."
            )
        ),
        max_guidance_weight=_shown(
            flags.DEFINE_float(
                "max_guidance_weight", 5.0, "rtc: the largest guidance weight (beta).", lower_bound=0
            )
        ),
        prefix_horizon=_shown(
            flags.DEFINE_integer(
                "prefix_horizon",
                None,
                "rtc: the prefix horizon s the robot sends (default: every action left in its chunk).",
                lower_bound=0,
            )
        ),
        noise_dims=_shown(
            flags.DEFINE_integer(
                "noise_dims",
                None,
                "Draw the action noise on the first N model action dims only, 0 on the rest (default: "
                "all dims, as openpi).",
                lower_bound=1,
            )
        ),
        fresh_samples=_shown(
            flags.DEFINE_integer(
                "fresh_samples",
                None,
                "Chunks a request without rtc (the first, every sync one) draws; the one inside the motion "
                "most of them took is kept (policies/chunk_choice.py). Default: the config's rtc.samples.",
                lower_bound=1,
            )
        ),
    )


def positive(holder: flags.FlagHolder) -> flags.FlagHolder:
    """A number flag that must be > 0 when given (absl's lower_bound admits the bound itself)."""
    flags.register_validator(holder, lambda value: value is None or value > 0, message="must be > 0")
    return holder


def define_out_flag(default: str | None, what: str) -> flags.FlagHolder:
    """`--out`: where a script writes what it produced (a file or a folder, as `what` says)."""
    return _shown(flags.DEFINE_string("out", default, what))


MESH = flags.DEFINE_string(
    "mesh",
    None,
    "Devices to shard over, as config engine.mesh: 'data:4' (rows and language slots split over 4 "
    "devices) or 'data:2,model:2' (and heads/MLP split over 2); default: one device.",
)
COORDINATOR = flags.DEFINE_string(
    "coordinator_address",
    os.environ.get("JAX_COORDINATOR_ADDRESS"),
    "Multi-host: host:port of process 0 (env JAX_COORDINATOR_ADDRESS); starts jax.distributed.",
)
NUM_PROCESSES = flags.DEFINE_integer(
    "num_processes", _env_int("JAX_NUM_PROCESSES"), "Multi-host: processes in all (env JAX_NUM_PROCESSES)."
)
PROCESS_ID = flags.DEFINE_integer(
    "process_id", _env_int("JAX_PROCESS_ID"), "Multi-host: this process's index (env JAX_PROCESS_ID)."
)


def build_engine(cfg, checkpoint_dir: str | None, seed: int = 0, params_dtype: str | None = None) -> Engine:
    """An engine on an openpi checkpoint (the config's own when none is given), or on a random-initialized
    model when neither exists."""
    model_config = config.model_config(cfg)
    params = load_params(
        model_config, config.checkpoint_for(cfg, checkpoint_dir), seed=seed, dtype=params_dtype
    )
    return Engine(params, model_config, mesh=mesh.mesh_from_spec(cfg.engine.mesh))


def parse_flags(argv: list[str]) -> list[str]:
    """absl flags parser that maps `--config=<name>` to its file in oxygen_jax/configs/ before parsing,
    then joins the other hosts (`--coordinator_address`), checks `--mesh` against the devices and sets it
    as the config's engine.mesh; a bad flag value ends the script with a one-line error."""
    try:
        rewritten = [
            "--config=" + config.config_path(arg.split("=", 1)[1]) if arg.startswith("--config=") else arg
            for arg in argv
        ]
        remaining = flags.FLAGS(rewritten)
        if not flags.FLAGS["verbosity"].present:
            # Libraries log at WARNING unless `--verbosity` asks for more (orbax logs each restore step
            # at INFO); set here, as a value, because absl raises a default verbosity to INFO.
            flags.FLAGS.verbosity = _QUIET
            # A server's own events (where it listens, connections opening and closing) are its output.
            logging.getLogger("oxygen_jax.serving").setLevel(logging.INFO)
        if COORDINATOR.value:
            jax.distributed.initialize(COORDINATOR.value, NUM_PROCESSES.value, PROCESS_ID.value)
        if MESH.value:
            mesh.parse_mesh(MESH.value)
            if "config" in flags.FLAGS:
                flags.FLAGS.config.engine.mesh = MESH.value
        return remaining
    except mesh.MeshError as error:
        fail(str(error))
    except (flags.Error, UserError) as error:
        fail(f"{error} (see --help)")
    except (AttributeError, KeyError) as error:  # ml_collections' answer to an unknown override path
        field = str(error).strip("\"'")
        fail(f"the config has no field {field!r} (a --config.<field>=... override names it; see --helpfull)")


def run(
    main: Callable[[list[str]], None],
    flags_parser: Callable[[list[str]], list[str]] = parse_flags,
) -> None:
    """`app.run(main)` for the tools: user mistakes (`UserError`) end it with one line on stderr, and
    `--help` shows the tool module's docstring whichever way it was started (console script, `python -m`
    or a checkout's `scripts/` wrapper)."""
    tool = sys.modules[main.__module__]
    sys.modules["__main__"].__doc__ = tool.__doc__
    # `--help` lists the main module's flags: started from a wrapper, that is not the tool's module.
    for flag in flags.FLAGS.get_flags_for_module(tool.__name__):
        flags.FLAGS.register_key_flag_for_module(sys.argv[0], flag)

    def reporting_user_errors(argv: list[str]) -> None:
        try:
            main(argv)
        except UserError as error:
            fail(str(error), getattr(error, "hint", None))

    # JAX logs at INFO each accelerator plugin it probes and does not find (`Unable to initialize backend
    # 'tpu'`); that is no news on a machine without one, so only its warnings are shown.
    logging.getLogger("jax._src.xla_bridge").setLevel(logging.WARNING)
    app.run(reporting_user_errors, flags_parser=flags_parser)


def fail(message: str, hint: str | None = None) -> None:
    """Ends a CLI with a one-line error instead of a traceback for user mistakes (and, when given, one
    line saying what to do)."""
    print(f"error: {' '.join(str(message).split())}", file=sys.stderr)
    if hint:
        print(f"  fix: {' '.join(hint.split())}", file=sys.stderr)
    sys.exit(2)
