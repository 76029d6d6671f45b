"""The engine: the contract of `engine/api.py` as jitted pure functions over (params, pytrees), compiled
once per shape.

prefill -> PrefixCache; denoise(cache) -> actions; act -> (PrefixCache, actions) in one program;
generate/score(cache) -> text; and the batch state entry points init_state / insert / decode(k) /
evict for continuous batching. Python objects never cross into jitted code; the batch state buffers are
donated so updates happen in place.
"""

import dataclasses
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh

from oxygen_jax.engine import action_program, api, batch_state, extension, kernels, language, sampling
from oxygen_jax.engine import guidance as guidance_lib
from oxygen_jax.engine import mesh as mesh_lib
from oxygen_jax.engine import prompt_buckets as prompt_buckets_lib
from oxygen_jax.models import pi05


@dataclasses.dataclass
class EngineStats:
    prefill_calls: int = 0


class Engine:
    """pi0.5 params + config, with every entry point jitted once."""

    def __init__(
        self,
        params: dict,
        config: pi05.Pi05Config,
        *,
        eos_id: int = 1,
        skip_masked_cameras: bool = True,
        kernel_policy: kernels.KernelPolicy | None = None,
        mesh: Mesh | None = None,
        prompt_buckets: tuple[int, ...] | None = None,
    ):
        """kernel_policy: how the large dots run (default: the one for this backend and its cores).
        prompt_buckets: prompt widths a batch's prompt arrays are cut to before prefill, the smallest
        that holds its longest prompt (`engine/prompt_buckets.py`; default: powers of two from 32 and
        max_token_len; () prefills every prompt column).

        The engine runs the layers one by one over per-layer params (`pi05.runtime_layout`): a layer
        sliced out of openpi's stacked weights would be copied before every use; without a mesh, with
        each layer's q/kv weights fused (`pi05.fused_layout`).
        mesh: a ("data", "model") mesh (`engine/mesh.py`) to shard over; None runs on the default device.
        """
        kernel_policy = kernel_policy or kernels.for_backend()
        # q, k and v as one projection on one device; a mesh keeps them apart, so its model axis splits
        # the q heads (sharding the fused weight would cut across q, k and v).
        fused_qkv = mesh is None
        self.config = dataclasses.replace(
            config, kernels=kernel_policy, scan_layers=False, fused_qkv=fused_qkv
        )
        self.eos_id = eos_id
        self.skip_masked_cameras = skip_masked_cameras
        self.mesh = mesh
        self.prompt_buckets = (
            prompt_buckets_lib.default_buckets(config.max_token_len)
            if prompt_buckets is None
            else prompt_buckets
        )
        params = pi05.runtime_layout(pi05.cast_params(params, config.dtype))
        if fused_qkv:
            params = pi05.fused_layout(params)
        self.params = jax.device_put(params, mesh and mesh_lib.param_shardings(params, mesh))
        self.stats = EngineStats()
        # With a mesh, observation rows are placed over its data axis on the way in and σ̂ keeps its slots
        # there (out_shardings); XLA's partitioner shards everything in between.
        rows_out = {"out_shardings": mesh_lib.logical_sharding(mesh, "batch")} if mesh else {}
        # Entry points are called with keywords: a signature change cannot shift which argument is
        # static or donated.
        hot = {"compiler_options": dict(kernel_policy.compiler_options)}
        self._prefill = jax.jit(
            prompt_buckets_lib.prefill, static_argnames=("config", "skip_cameras", "pad"), **hot
        )
        self._act = jax.jit(
            action_program.act,
            static_argnames=("config", "num_steps", "skip_cameras", "pad", "denoiser"),
            **hot,
        )
        # num_steps static: the flow loop's trip count is a compile-time constant (one program per count).
        denoise_static = ("config", "num_steps")
        self._denoise = jax.jit(pi05.denoise, static_argnames=denoise_static, **hot)
        self._guided_denoise = jax.jit(guidance_lib.guided_denoise, static_argnames=denoise_static, **hot)
        self._conditioned_denoise = jax.jit(
            guidance_lib.conditioned_denoise, static_argnames=denoise_static, **hot
        )
        self._generate = jax.jit(
            language.generate, static_argnames=("config", "max_new_tokens", "eos_id", "mode")
        )
        self._score = jax.jit(language.score, static_argnames="config")
        self._init_state = (
            jax.jit(
                batch_state.init_state,
                static_argnames=("config", "max_slots", "max_new_tokens", "prefix_len"),
                **rows_out,
            )
            if mesh
            else batch_state.init_state
        )
        self._insert = jax.jit(batch_state.insert, donate_argnames="state", **rows_out)
        self._decode = jax.jit(
            batch_state.decode,
            static_argnames=("config", "num_steps", "eos_id", "mode"),
            donate_argnames="state",
            compiler_options=dict(kernel_policy.decode_options + kernel_policy.compiler_options),
            **rows_out,
        )
        self._evict = jax.jit(batch_state.evict, donate_argnames="state", **rows_out)
        self._select_rows = jax.jit(batch_state.select_rows)
        self._extend = jax.jit(extension.extend, static_argnames="config")

    # --- one observation batch ---
    def prefill(self, obs: pi05.Observation) -> pi05.PrefixCache:
        """One prefix pass. Cameras masked in every row are skipped (a third less work for LIBERO and
        DROID, which always mask one of three), unless the engine was built with skip_masked_cameras=False;
        the prompt columns run to the batch's prompt bucket only, the cache keeps the prompt's width."""
        self.stats.prefill_calls += 1
        skip_cameras = self.masked_cameras(obs)
        obs, pad = self.cut_prompt(obs)
        return self._prefill(
            params=self.params,
            config=self.config,
            obs=self._place_rows(obs),
            skip_cameras=skip_cameras,
            pad=pad,
        )

    def cut_prompt(self, obs: pi05.Observation) -> tuple[pi05.Observation, int]:
        """The observation with its prompt cut to its bucket, and the prompt columns cut off."""
        columns = obs.tokenized_prompt_mask.shape[1]
        width = prompt_buckets_lib.width(obs.tokenized_prompt_mask, self.prompt_buckets)
        return prompt_buckets_lib.cut(obs, width), columns - width

    @property
    def data_size(self) -> int:
        """Devices the rows split over: every batch the engine sees is a multiple of it."""
        return mesh_lib.data_size(self.mesh)

    @staticmethod
    def to_host(tree):
        """Device arrays as numpy; on a mesh across processes, each process gets the whole arrays."""
        if all(x.is_fully_addressable for x in jax.tree.leaves(tree)):
            return jax.device_get(tree)
        return multihost_utils.process_allgather(tree, tiled=True)

    def _place_rows(self, tree):
        """With a mesh, puts a batch (leading dim rows) over its data axis; as it is without one."""
        return tree if self.mesh is None else mesh_lib.place_rows(tree, self.mesh)

    def masked_cameras(self, obs: pi05.Observation) -> tuple[str, ...]:
        if not self.skip_masked_cameras:
            return ()
        return tuple(k for k in self.config.image_keys if not np.asarray(obs.image_masks[k]).any())

    def denoise(
        self,
        cache: pi05.PrefixCache,
        noise: jax.Array,
        num_steps: int = 10,
        guidance: Sequence[api.ChunkGuidance | None] = (),
    ) -> jax.Array:
        """Plain denoising unless some row carries non-zero prefix weights; then one guided program for the
        whole batch, where rows without guidance get zero weights, hence the plain program's actions bit for
        bit. A batch with no guided row runs the plain program, at no extra cost. A model trained with a
        clean prefix (`max_clean_prefix` > 0) conditions on the rows' frozen actions instead of guiding
        (`guidance.conditioned_denoise`), from delay 1 on."""
        inputs = dict(params=self.params, config=self.config, cache=cache, noise=self._place_rows(noise))
        denoiser, rows = self._denoiser(guidance, noise.shape)
        if rows is None:
            return self._denoise(**inputs, num_steps=int(num_steps))
        program = self._guided_denoise if denoiser == "guided" else self._conditioned_denoise
        return program(**inputs, num_steps=int(num_steps), guidance=rows)

    def act(
        self,
        obs: pi05.Observation,
        noise: jax.Array,
        num_steps: int = 10,
        guidance: Sequence[api.ChunkGuidance | None] = (),
    ) -> tuple[pi05.PrefixCache, jax.Array]:
        """`prefill` then `denoise` as one program (`engine/action_program.py`): (the prefix cache, for
        language, and the actions). One compilation per prefill shape, prompt width, num_steps (static)
        and denoiser; the actions are `denoise`'s to float32 rounding."""
        self.stats.prefill_calls += 1
        skip_cameras = self.masked_cameras(obs)
        obs, pad = self.cut_prompt(obs)
        denoiser, rows = self._denoiser(guidance, noise.shape)
        return self._act(
            params=self.params,
            config=self.config,
            obs=self._place_rows(obs),
            noise=self._place_rows(noise),
            num_steps=int(num_steps),
            skip_cameras=skip_cameras,
            pad=pad,
            denoiser=denoiser,
            guidance=rows,
        )

    def _denoiser(
        self, guidance: Sequence[api.ChunkGuidance | None], shape: tuple[int, ...]
    ) -> tuple[str, guidance_lib.Guidance | None]:
        """Which denoiser a batch runs and its guidance rows: plain (None) unless some row carries
        non-zero prefix weights (guided) or, for a model trained with a clean prefix, frozen actions
        (conditioned)."""
        columns = api.guidance_columns(guidance, *shape)
        denoiser, active = "guided", columns["weights"]
        if self.config.max_clean_prefix:
            denoiser, active = "conditioned", columns["frozen"]
        if not active.any():
            return "plain", None
        return denoiser, guidance_lib.Guidance(
            **self._place_rows({k: jnp.asarray(v) for k, v in columns.items()})
        )

    def noise(self, rng: jax.Array, batch: int) -> jax.Array:
        return jax.random.normal(rng, (batch, self.config.action_horizon, self.config.action_dim))

    def generate(
        self,
        cache: pi05.PrefixCache,
        max_new_tokens: int,
        *,
        temperature: float | np.ndarray = 0.0,
        top_p: float | np.ndarray = 1.0,
        max_new: int | np.ndarray | None = None,
        seed: int = 0,
    ) -> language.TextOutput:
        """Decodes every row to completion; row i samples from seed `seed * B + i`."""
        batch = cache.mask.shape[0]
        rows = self._per_row(batch, max_new_tokens if max_new is None else max_new, temperature, top_p)
        seeds = jnp.arange(batch, dtype=jnp.uint32) + np.uint32(seed * batch % 2**32)
        mode = sampling.SamplingMode.of(temperature, top_p)
        max_new, temperature, top_p = rows
        return self._generate(
            params=self.params,
            config=self.config,
            cache=cache,
            max_new_tokens=max_new_tokens,
            max_new=max_new,
            temperature=temperature,
            top_p=top_p,
            seeds=seeds,
            eos_id=self.eos_id,
            mode=mode,
        )

    def score(self, cache: pi05.PrefixCache, tokens: np.ndarray) -> jax.Array:
        return self._score(
            params=self.params, config=self.config, cache=cache, tokens=jnp.asarray(tokens, jnp.int32)
        )

    def act_and_speak(
        self, obs: pi05.Observation, noise: jax.Array, num_steps: int, max_new_tokens: int, **text_kwargs
    ) -> tuple[jax.Array, language.TextOutput]:
        """Cross-task KV sharing: one prefill feeds both the action expert and the language decoder."""
        cache = self.prefill(obs)
        return self.denoise(cache, noise, num_steps), self.generate(cache, max_new_tokens, **text_kwargs)

    def extend(
        self, cache: pi05.PrefixCache, rows: np.ndarray, suffixes: list, suffix_len: int | None = None
    ) -> pi05.PrefixCache:
        """Appends one token suffix per task to prefix rows `rows` in one call (see `extension.extend`).

        Tasks are padded to a power of two and suffixes to `suffix_len` columns (default: the next
        power of two >= 8), so a steady stream of frames compiles once. Returns the padded cache:
        rows beyond len(suffixes) are padding (insert them into no slot).
        """
        lengths = [len(s) for s in suffixes]
        if not suffixes or min(lengths) < 1:
            raise ValueError("every task needs a non-empty suffix")
        width = suffix_len or max(8, 1 << (max(lengths) - 1).bit_length())
        if max(lengths) > width:
            raise ValueError(f"a task suffix of {max(lengths)} tokens exceeds suffix_len={width}")
        tasks = 1 << (len(suffixes) - 1).bit_length()
        tokens = np.zeros((tasks, width), np.int32)
        mask = np.zeros((tasks, width), bool)
        mask[:, 0] = True  # padding tasks: one token, so every row has a last suffix token
        for t, suffix in enumerate(suffixes):
            tokens[t, : len(suffix)] = suffix
            mask[t, : len(suffix)] = True
        rows = np.concatenate([np.asarray(rows, np.int32), np.zeros(tasks - len(suffixes), np.int32)])
        return self._extend(
            params=self.params,
            config=self.config,
            cache=cache,
            rows=jnp.asarray(rows),
            suffix=tokens,
            suffix_mask=mask,
        )

    # --- continuous batching ---
    def init_state(
        self, max_slots: int, max_new_tokens: int, prefix_len: int | None = None
    ) -> batch_state.BatchState:
        mesh_lib.check_divides(self.data_size, max_slots=max_slots)
        return self._init_state(
            config=self.config, max_slots=max_slots, max_new_tokens=max_new_tokens, prefix_len=prefix_len
        )

    def prefix_len(self, obs: pi05.Observation) -> int:
        """Columns `prefill(obs)` produces: skipped cameras leave theirs out."""
        return self.config.prefix_len - self.config.image_tokens * len(self.masked_cameras(obs))

    def insert(
        self,
        state: batch_state.BatchState,
        cache: pi05.PrefixCache,
        inserts: Sequence[api.SlotInsert],
        rows: np.ndarray | None = None,
    ) -> batch_state.BatchState:
        """Row i of `cache` (row rows[i] when given: the selection runs in the insert's program) into the
        slot inserts[i] names; rows beyond the inserts are padding (a bucketed batch), dropped."""
        count = cache.mask.shape[0] if rows is None else len(rows)
        columns = {k: jnp.asarray(v) for k, v in api.insert_columns(inserts, count, state.max_slots).items()}
        if rows is not None:
            columns["rows"] = jnp.asarray(rows, jnp.int32)
        return self._insert(state=state, cache=cache, **columns)

    def select_rows(self, cache: pi05.PrefixCache, rows: np.ndarray) -> pi05.PrefixCache:
        return self._select_rows(cache, jnp.asarray(rows, jnp.int32))

    def decode(
        self, state: batch_state.BatchState, num_steps: int, mode: sampling.SamplingMode
    ) -> batch_state.BatchState:
        """Up to `num_steps` tokens per active slot, as the power-of-two programs of
        `batch_state.step_chunks` (dispatched back to back, no host round trip between them); counts
        beyond the state's max_new_tokens change nothing, so they are cut there. mode: the sampling paths
        the occupied slots need."""
        for steps in batch_state.step_chunks(min(num_steps, state.max_new_tokens)):
            state = self._decode(
                params=self.params,
                config=self.config,
                state=state,
                num_steps=steps,
                eos_id=self.eos_id,
                mode=mode,
            )
        return state

    def evict(self, state: batch_state.BatchState, slots: np.ndarray) -> batch_state.BatchState:
        return self._evict(state=state, slots=jnp.asarray(slots, jnp.int32))

    @staticmethod
    def _per_row(batch: int, max_new, temperature, top_p) -> tuple[jax.Array, jax.Array, jax.Array]:
        return (
            jnp.broadcast_to(jnp.asarray(max_new, jnp.int32), (batch,)),
            jnp.broadcast_to(jnp.asarray(temperature, jnp.float32), (batch,)),
            jnp.broadcast_to(jnp.asarray(top_p, jnp.float32), (batch,)),
        )
