"""Config helpers: the shared base of every `oxygen_jax/configs/*.py` file and its conversion to `Pi05Config`.

Configs are ml_collections ConfigDicts (data, overridable from the command line as
`--config.model.action_horizon=16`); the model only ever sees the frozen `Pi05Config` built here.
"""

import pathlib

import jax
import ml_collections

from oxygen_jax.errors import ConfigError
from oxygen_jax.models import gemma, pi05, siglip
from oxygen_jax.tokenizer import Tokenizer

IMAGE_KEYS = ("base_0_rgb", "left_wrist_0_rgb", "right_wrist_0_rgb")
# Shipped inside the package, so an installed wheel finds them by name as an editable checkout does.
CONFIGS_DIR = pathlib.Path(__file__).resolve().parent / "configs"

_GEMMA_VARIANTS = {
    "dummy": dict(width=64, depth=4, mlp_dim=128, num_heads=8, num_kv_heads=1, head_dim=16),
    "gemma_300m": dict(width=1024, depth=18, mlp_dim=4096, num_heads=8, num_kv_heads=1, head_dim=256),
    "gemma_2b": dict(width=2048, depth=18, mlp_dim=16_384, num_heads=8, num_kv_heads=1, head_dim=256),
}


def gemma_variant(name: str) -> ml_collections.ConfigDict:
    return ml_collections.ConfigDict(_GEMMA_VARIANTS[name])


def base_config() -> ml_collections.ConfigDict:
    """Full-size pi0.5 (gemma_2b + gemma_300m + So400m/14), as openpi's `Pi0Config(pi05=True)`; every key
    a config file or a tool may set is declared here."""
    c = ml_collections.ConfigDict()
    c.name = "pi05"
    c.model = ml_collections.ConfigDict()
    c.model.paligemma = gemma_variant("gemma_2b")
    c.model.action_expert = gemma_variant("gemma_300m")
    c.model.vision = "So400m/14"
    c.model.vocab_size = 257_152
    c.model.action_dim = 32
    c.model.action_horizon = 50
    c.model.max_token_len = 200
    c.model.image_keys = IMAGE_KEYS
    c.model.image_size = 224
    # "auto": float32 on CPU (XLA:CPU bf16 matvec is ~20x slower), bfloat16 on GPU/TPU.
    c.model.dtype = "auto"
    # "bidirectional" (openpi's prefix) or "causal_text" (text tokens causal inside the prefix).
    c.model.prefix_attention = "bidirectional"
    c.model.discrete_state_input = True
    # > 0: trained with up to this many leading actions given clean; real-time chunking then conditions on
    # them instead of guiding (`Pi05Config.max_clean_prefix`, docs/rtc.md).
    c.model.max_clean_prefix = 0
    # How real-time chunking runs unless told otherwise (`policies/rtc_defaults.py`): the method follows
    # from max_clean_prefix; samples: the chunks a request that continues no chunk draws (docs/rtc.md).
    c.rtc = ml_collections.ConfigDict()
    c.rtc.samples = 1
    c.num_steps = 10
    # None: openpi's cache (see oxygen_jax.tokenizer); "standin": the bundled 1024-piece stand-in.
    c.tokenizer_path = ml_collections.FieldReference(None, field_type=str)
    c.seed = 0
    # The robot whose transforms wrap the model (policies.policy: libero, droid, aloha, aloha_sim, table);
    # None: the model alone (engine-level tools), no policy.
    c.robot = ml_collections.FieldReference(None, field_type=str)
    # The table task `oxygen-eval-table` runs the model on (table_task/): detour, or detour_moving.
    c.table_task = "detour"
    # Where norm stats live inside a checkpoint (<checkpoint>/assets/<asset_id>/), as openpi's asset id.
    c.asset_id = ml_collections.FieldReference(None, field_type=str)
    # The checkpoint tools load when none is given on the command line; None: a random-initialized model.
    c.checkpoint_dir = ml_collections.FieldReference(None, field_type=str)
    c.engine = ml_collections.ConfigDict()
    c.engine.max_slots = 8
    c.engine.max_new_tokens = 30
    c.engine.temperature = 0.0
    c.engine.top_p = 1.0
    # Devices to shard over (engine/mesh.py): "" = the default device; "data:4", "data:2,model:2".
    c.engine.mesh = ""
    c.training = training_defaults()
    c.data = data_defaults()
    # Locked: setting a key the base does not declare (a misspelt override included) raises.
    c.lock()
    return c


def data_defaults() -> ml_collections.ConfigDict:
    """How a LeRobot dataset feeds the robot in training (`training.data.from_config`); empty `repack`: the
    config names no dataset columns, so it cannot train on a dataset until it does."""
    d = ml_collections.ConfigDict()
    # Raw observation key -> dataset column, as "key=column" pairs.
    d.repack = ()
    d.actions = "action"
    # Column of a per-frame subtask text trained as the language target; None: actions only.
    d.subtask = ml_collections.FieldReference(None, field_type=str)
    # Column of a per-frame least clean prefix (actions the chunk holds that the frame must not teach, as a
    # stale chunk's actions a robot executes while it waits: `training/loss.py`); None: every frame 0.
    d.min_clean_prefix = ml_collections.FieldReference(None, field_type=str)
    # Share of train examples that carry their subtask text (the others train actions on the prompt alone).
    d.text_fraction = 1.0
    # Decode every image once up front instead of every epoch (small datasets).
    d.keep_decoded = False
    return d


def training_defaults() -> ml_collections.ConfigDict:
    """openpi's fine-tuning recipe (oxygen_jax.training): AdamW + warmup-cosine, EMA, actions-only loss."""
    t = ml_collections.ConfigDict()
    t.batch_size = 32
    t.num_train_steps = 30_000
    # openpi's AdamW() and CosineDecaySchedule() defaults.
    t.peak_lr = 2.5e-5
    t.warmup_steps = 1_000
    t.decay_steps = 30_000
    t.decay_lr = 2.5e-6
    t.b1 = 0.9
    t.b2 = 0.95
    t.eps = 1e-8
    t.weight_decay = 1e-10
    t.clip_gradient_norm = 1.0
    # openpi's pi0.5 fine-tunes average the params with 0.999; None turns the EMA off (openpi's LoRA runs).
    t.ema_decay = ml_collections.FieldReference(0.999, field_type=float)
    # The subtask text loss needs model.prefix_attention="causal_text"; 0: openpi's actions-only loss.
    t.text_loss_weight = 0.0
    t.action_loss_weight = 1.0
    # Action dims the flow loss averages over (0: all of model.action_dim; the rest is padding).
    t.real_action_dim = 0
    # Regex over "/"-joined param paths kept fixed, e.g. "PaliGemma/img/.*" (the vision tower).
    t.freeze = ""
    # Frozen params are stored in this dtype (openpi: bfloat16); None keeps them as loaded.
    t.frozen_dtype = ml_collections.FieldReference("bfloat16", field_type=str)
    # LoRA rank per Gemma expert (0: off); openpi's gemma_2b_lora uses 16, gemma_300m_lora 32.
    t.lora_paligemma_rank = 0
    t.lora_action_expert_rank = 0
    t.log_interval = 100
    t.save_interval = 1_000
    # Checkpoints kept besides the latest: every step divisible by keep_period (0: none).
    t.keep_period = 5_000
    return t


def checkpoint_for(cfg: ml_collections.ConfigDict, checkpoint_dir: str | None) -> str | None:
    """The checkpoint a tool loads: the one asked for, else the config's own (`pi05_demo` ships one in the
    package), else None (a random-initialized model)."""
    return checkpoint_dir or cfg.checkpoint_dir or None


def resolve_dtype(dtype: str) -> str:
    if dtype == "auto":
        return "float32" if jax.default_backend() == "cpu" else "bfloat16"
    if dtype not in ("float32", "bfloat16"):
        raise ConfigError(f"model.dtype must be 'auto', 'float32' or 'bfloat16', got {dtype!r}")
    return dtype


def model_config(cfg: ml_collections.ConfigDict) -> pi05.Pi05Config:
    """The frozen model description for `cfg.model` (dtype resolved for this backend)."""
    m = cfg.model
    return pi05.Pi05Config(
        paligemma=gemma.GemmaConfig(**m.paligemma.to_dict()),
        action_expert=gemma.GemmaConfig(**m.action_expert.to_dict()),
        vision=siglip.siglip_variant(m.vision),
        vocab_size=m.vocab_size,
        action_dim=m.action_dim,
        action_horizon=m.action_horizon,
        max_token_len=m.max_token_len,
        image_keys=tuple(m.image_keys),
        image_size=m.image_size,
        dtype=resolve_dtype(m.dtype),
        prefix_attention=m.prefix_attention,
        max_clean_prefix=m.max_clean_prefix,
    )


def build_tokenizer(cfg: ml_collections.ConfigDict, tokenizer_path: str | None = None) -> Tokenizer:
    """The config's tokenizer (`tokenizer_path` overrides the config's), padding or cutting prompts to the
    model's `max_token_len` as openpi's `PaligemmaTokenizer(model.max_token_len)`."""
    return Tokenizer(tokenizer_path or cfg.tokenizer_path, max_len=cfg.model.max_token_len)


def known_configs() -> list[str]:
    """Names `--config` accepts (the files shipped in oxygen_jax/configs/)."""
    return sorted(p.stem for p in CONFIGS_DIR.glob("*.py") if p.stem != "__init__")


def config_path(name_or_path: str) -> str:
    """`pi05_tiny` -> `oxygen_jax/configs/pi05_tiny.py`; paths (with a `:arg` suffix) pass through."""
    path, sep, arg = name_or_path.partition(":")
    if not path.endswith(".py"):
        candidate = CONFIGS_DIR / f"{path}.py"
        if not candidate.exists():
            raise ConfigError(
                f"no config named {path!r}; use one of {', '.join(known_configs())} or a path to a .py file"
            )
        path = str(candidate)
    return path + sep + arg


def load_config(name_or_path: str) -> ml_collections.ConfigDict:
    """Loads a config by name or path (for tests, notebooks and library use)."""
    import importlib.util

    path = config_path(name_or_path).partition(":")[0]
    spec = importlib.util.spec_from_file_location(pathlib.Path(path).stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    # Locked again from the top: sub-dicts the file replaced after `base_config` (model.paligemma) too.
    return module.get_config().unlock().lock()


def get_config(name_or_path: str) -> ml_collections.ConfigDict:
    """openpi's name for `load_config` (`openpi.training.config.get_config`): ported scripts read the same."""
    return load_config(name_or_path)
