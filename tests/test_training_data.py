"""LeRobot-format datasets: write -> read round trip, train examples with the subtask loss mask, norm stats,
and one-line errors for missing columns and malformed files. Every dataset is written here."""

import json

import numpy as np
import pytest

from oxygen_jax import config
from oxygen_jax.errors import ConfigError
from oxygen_jax.lerobot.reader import DatasetError, LeRobotDataset
from oxygen_jax.lerobot.writer import LeRobotWriter
from oxygen_jax.policies import normalization
from oxygen_jax.table_task import dataset as table_dataset
from oxygen_jax.table_task import scenes as table_scenes
from oxygen_jax.tokenizer import Tokenizer
from oxygen_jax.training.data import from_config
from oxygen_jax.training.data.examples import append_target
from oxygen_jax.training.data.norm_stats import NUM_QUANTILE_BINS, RunningStats
from oxygen_jax.training.data.prefetch import prefetch

HORIZON = config.load_config("pi05_demo").model.action_horizon


def _record(root, num_scenes=2, frames=4, seed=0):
    """Table-demo episodes: `frames` gripper positions per scene, the next position as the action."""
    writer = LeRobotWriter(root, fps=10, robot_type="table")
    scenes = []
    for scene, _ in zip(table_scenes.scenes(seed), range(num_scenes), strict=False):
        for step in range(frames):
            writer.add_frame(table_dataset.frame(scene, step), task=scene.prompt)
        writer.save_episode()
        scenes.append(scene)
    return scenes


@pytest.fixture
def demo_dataset(tmp_path):
    root = tmp_path / "demo"
    return root, _record(root)


def test_written_dataset_reads_back_the_recorded_frames(demo_dataset):
    root, scenes = demo_dataset
    dataset = LeRobotDataset(root)
    assert [e.length for e in dataset.episodes] == [4, 4]
    assert sorted(dataset.tasks.values()) == sorted({s.prompt for s in scenes})
    columns = ["observation.image", "observation.state", "action", "subtask", "task_index"]
    episode = dataset.read_episode(dataset.episodes[1], columns)
    np.testing.assert_array_equal(
        episode["observation.image"][2], scenes[1].observation(2)["observation/image"]
    )
    np.testing.assert_array_equal(episode["observation.state"][3], scenes[1].gripper(3))
    np.testing.assert_array_equal(episode["action"][0], scenes[1].gripper(1))
    assert episode["subtask"] == [scenes[1].subtask] * 4
    assert dataset.tasks[int(episode["task_index"][0])] == scenes[1].prompt


def test_action_chunks_repeat_the_last_action_past_the_episode_end(demo_dataset):
    root, scenes = demo_dataset
    cfg = config.load_config("pi05_demo")
    frame = from_config.train_examples(cfg, str(root), None).source.frame(2)  # episode 0, step 2 of 4
    expected = np.stack([scenes[0].gripper(min(step, 3) + 1) for step in range(2, 2 + HORIZON)])
    np.testing.assert_array_equal(frame["actions"], expected)
    assert frame["prompt"] == scenes[0].prompt and frame["subtask"] == scenes[0].subtask


def test_subtask_tokens_follow_the_serving_prompt_under_the_loss_mask(demo_dataset):
    root, scenes = demo_dataset
    cfg = config.load_config("pi05_demo")
    examples = from_config.train_examples(cfg, str(root), None)
    tokenizer = Tokenizer("standin", max_len=cfg.model.max_token_len)
    prompt_ids, prompt_mask = tokenizer.tokenize(scenes[0].prompt)
    n = int(prompt_mask.sum())

    with_text = examples.example(0, with_text=True)
    target = tokenizer.tokenize_target(scenes[0].subtask)
    np.testing.assert_array_equal(with_text["tokenized_prompt"][:n], prompt_ids[:n])
    np.testing.assert_array_equal(with_text["tokenized_prompt"][n : n + len(target)], target)
    assert with_text["token_loss_mask"].tolist() == [
        n <= i < n + len(target) for i in range(len(prompt_mask))
    ]
    assert (
        tokenizer.detokenize(with_text["tokenized_prompt"][with_text["token_loss_mask"]]) == scenes[0].subtask
    )

    without = examples.example(0, with_text=False)
    np.testing.assert_array_equal(without["tokenized_prompt"], prompt_ids)
    assert not without["token_loss_mask"].any()
    assert without["actions"].shape == (HORIZON, cfg.model.action_dim)
    assert without["image/base_0_rgb"].shape == (224, 224, 3)


def test_batches_stack_examples_and_mix_text_and_action_only_rows(demo_dataset):
    root, _ = demo_dataset
    cfg = config.load_config("pi05_demo")
    batch = next(from_config.train_examples(cfg, str(root), None).batches(6, seed=1, text_fraction=0.5))
    assert batch["tokenized_prompt"].shape == (6, cfg.model.max_token_len)
    assert batch["actions"].shape == (6, HORIZON, cfg.model.action_dim)
    has_text = batch["token_loss_mask"].any(axis=1)
    assert 0 < has_text.sum() < 6
    bigger = next(from_config.train_examples(cfg, str(root), None).batches(20, prefetch_batches=0))
    assert bigger["actions"].shape[0] == 20  # more than the dataset's 8 frames: epochs repeat


def test_target_that_does_not_fit_is_a_one_line_error():
    ids, mask = np.zeros(6, np.int32), np.array([True] * 4 + [False] * 2)
    with pytest.raises(
        ValueError, match=r"prompt \(4 tokens\) \+ subtask \(3 tokens\) exceed max_token_len 6"
    ):
        append_target(ids, mask, [5, 6, 7])


def test_norm_stats_match_exact_quantiles_to_the_bin_width_and_load_as_openpi(tmp_path):
    rng = np.random.default_rng(0)
    data = rng.normal(size=(2000, 3)) * [1.0, 5.0, 0.1]
    running = RunningStats()
    for chunk in np.array_split(data, 7):  # later chunks widen the range: counts are re-binned
        running.update(chunk)
    stats = running.stats()
    width = (data.max(0) - data.min(0)) / NUM_QUANTILE_BINS
    np.testing.assert_allclose(stats.mean, data.mean(0), rtol=1e-12)
    np.testing.assert_allclose(stats.std, data.std(0), rtol=1e-9)
    # openpi's quantile q is the left edge of the bin holding the ceil(q * n)-th smallest value; each
    # re-binning moves counts down by less than one bin.
    ordered = np.sort(data, axis=0)
    for q, got in ((0.01, stats.q01), (0.99, stats.q99)):
        kth = ordered[int(np.ceil(q * len(data))) - 1]
        assert ((kth - got >= 0) & (kth - got < 8 * width)).all()
    loaded = normalization.load_norm_stats(normalization.save_norm_stats(tmp_path, {"state": stats}))
    np.testing.assert_array_equal(loaded["state"].q99, stats.q99)


def test_dataset_norm_stats_cover_state_and_every_chunk_step(demo_dataset):
    root, scenes = demo_dataset
    stats = from_config.dataset_norm_stats(config.load_config("pi05_demo"), str(root))
    states = np.stack([s.gripper(step) for s in scenes for step in range(4)])
    np.testing.assert_allclose(stats["state"].mean, states.mean(0), rtol=1e-6)
    assert stats["actions"].q01.shape == (2,)


def test_least_clean_prefix_column_reaches_each_example_and_batch(tmp_path):
    """A dataset column named by `data.min_clean_prefix` gives each example its frame's value as an int."""
    writer = LeRobotWriter(tmp_path / "stale", fps=10, robot_type="table")
    scene = next(table_scenes.scenes(0))
    for step in range(4):
        writer.add_frame(
            {**table_dataset.frame(scene, step), "stale": np.float32(3 - step)}, task=scene.prompt
        )
    writer.save_episode()
    cfg = config.load_config("pi05_demo")
    cfg.data.min_clean_prefix = "stale"
    with pytest.raises(ConfigError, match=r"sets data.min_clean_prefix but trains no clean prefix"):
        from_config.train_examples(cfg, str(tmp_path / "stale"), None)
    cfg.model.max_clean_prefix = 5
    examples = from_config.train_examples(cfg, str(tmp_path / "stale"), None)
    assert [int(examples.example(i)["min_clean_prefix"]) for i in range(4)] == [3, 2, 1, 0]
    batch = next(examples.batches(4, prefetch_batches=0))
    assert batch["min_clean_prefix"].dtype == np.int32 and sorted(batch["min_clean_prefix"]) == [0, 1, 2, 3]
    cfg.data.min_clean_prefix = None
    assert "min_clean_prefix" not in from_config.train_examples(cfg, str(tmp_path / "stale"), None).example(0)


def test_missing_column_is_named(demo_dataset):
    root, _ = demo_dataset
    cfg = config.load_config("pi05_demo")
    cfg.data.subtask = "narration"
    with pytest.raises(DatasetError, match=r"no column 'narration'; meta/info.json features"):
        from_config.train_examples(cfg, str(root), None)


def test_malformed_files_are_one_line_errors(demo_dataset):
    root, _ = demo_dataset
    parquet = root / "data" / "chunk-000" / "episode_000001.parquet"
    parquet.write_bytes(b"not parquet")
    dataset = LeRobotDataset(root)
    with pytest.raises(DatasetError, match=r"episode_000001.parquet: not a readable parquet file"):
        dataset.read_episode(dataset.episodes[1], ["action"])
    (root / "meta" / "episodes.jsonl").write_text('{"episode_index": 0, "length": 4}\n{"episode_index": 1\n')
    with pytest.raises(DatasetError, match=r"episodes.jsonl line 2: invalid JSON"):
        LeRobotDataset(root)
    info = json.loads((root / "meta" / "info.json").read_text())
    (root / "meta" / "info.json").write_text(json.dumps({**info, "codebase_version": "v3.0"}))
    with pytest.raises(DatasetError, match=r"codebase_version 'v3.0'"):
        LeRobotDataset(root)


def test_video_features_are_decoded_at_the_frame_timestamps(demo_dataset):
    iio = pytest.importorskip("imageio.v3")
    pytest.importorskip("imageio_ffmpeg")
    root, scenes = demo_dataset
    info = json.loads((root / "meta" / "info.json").read_text())
    info["video_path"] = "videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4"
    info["features"]["observation.video"] = {"dtype": "video", "shape": [224, 224, 3], "names": None}
    (root / "meta" / "info.json").write_text(json.dumps(info))
    frames = np.stack([scenes[0].observation(step)["observation/image"] for step in range(4)])
    video = root / "videos" / "chunk-000" / "observation.video" / "episode_000000.mp4"
    video.parent.mkdir(parents=True)
    iio.imwrite(video, frames, fps=10, codec="libx264", macro_block_size=1)
    dataset = LeRobotDataset(root)
    decoded = dataset.read_episode(dataset.episodes[0], ["observation.video"])["observation.video"]
    assert decoded.shape == frames.shape
    errors = np.abs(decoded.astype(int)[:, None] - frames.astype(int)[None]).mean(axis=(2, 3, 4))
    assert (errors.argmin(axis=1) == np.arange(4)).all()  # each row gets its own frame back


def test_prefetched_items_keep_their_order_and_a_producer_error_reaches_the_consumer():
    def items():
        yield from range(5)
        raise DatasetError("episode_000003.parquet: not a readable parquet file")

    stream = prefetch(items(), size=2)
    assert [next(stream) for _ in range(5)] == [0, 1, 2, 3, 4]
    with pytest.raises(DatasetError, match="not a readable parquet file"):
        next(stream)
    assert list(prefetch(iter(range(3)))) == [0, 1, 2]


def test_recorded_aloha_frames_train_as_the_served_observation(tmp_path):
    """ALOHA observations are nested with CHW cameras; recordings store them under "/"-joined keys as HWC.
    A train example of a recorded frame must equal what serving makes of the observation itself."""
    from oxygen_jax.evaluation.recording import recorded_frame
    from oxygen_jax.policies.policy import robot, robot_pipeline
    from oxygen_jax.policies.robot_io import RobotIO

    cfg = config.load_config("pi05_tiny")
    cfg.robot = "aloha"
    cfg.model.max_token_len = 96  # the prompt carries 14 discretized state values
    cams = ("cam_high", "cam_left_wrist", "cam_right_wrist")
    cfg.data.repack = (*(f"images/{c}=images/{c}" for c in cams), "state=state")
    cfg.data.subtask = "text"
    rng = np.random.default_rng(0)
    obs = {
        "images": {c: rng.integers(0, 256, (3, 48, 64), dtype=np.uint8) for c in cams},
        "state": rng.uniform(-1, 1, 14).astype(np.float32),
        "prompt": "fold the towel",
    }
    writer = LeRobotWriter(tmp_path / "aloha", fps=50, robot_type="aloha")
    writer.add_frame(recorded_frame(obs, rng.uniform(-1, 1, 14), "grasp the corner"), task=obs["prompt"])
    writer.save_episode()

    examples = from_config.train_examples(cfg, str(tmp_path / "aloha"), norm_stats=None)
    example = examples.example(0)
    model_config = config.model_config(cfg)
    tokenizer = Tokenizer(cfg.tokenizer_path, max_len=model_config.max_token_len)
    served = RobotIO(robot(cfg).raw_spec, robot_pipeline(cfg, None, tokenizer), model_config).inputs(obs)
    for key in ("state", *(k for k in served if k.startswith(("image/", "image_mask/")))):
        np.testing.assert_array_equal(example[key], served[key], err_msg=key)
    assert example["token_loss_mask"].sum() > 0  # the recorded text is the subtask target
