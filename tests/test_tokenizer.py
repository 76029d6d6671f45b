"""Tokenizer parity with openpi's PaliGemma prompt formats, checked on the golden stand-in model."""

import json
import logging
import pathlib
import uuid

import fsspec
import numpy as np
import pytest
from conftest import GOLDEN, load_script

from oxygen_jax.tokenizer import Tokenizer, discretize_state, resolve_tokenizer_path

STANDIN = GOLDEN / "tokenizer" / "tiny_paligemma_standin.model"
CASES = json.loads((GOLDEN / "tokenizer" / "tokenizer_cases.json").read_text())["cases"]
# The prompt of batch element 0 in model_io.npz, from which the golden subtask prompt was made.
SUBTASK_SOURCE_PROMPT = "pick up the black bowl and place it on the plate"


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer(STANDIN, max_len=48)


def _tokenize_case(tok: Tokenizer, case: dict) -> tuple[np.ndarray, np.ndarray]:
    state = None if case["state"] is None else np.asarray(case["state"], dtype=np.float32)
    return Tokenizer(tok.path, max_len=case["max_len"]).tokenize(case["prompt"], state)


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_golden_case(tok: Tokenizer, case: dict, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        ids, mask = _tokenize_case(tok, case)
    assert ids.dtype == np.int32 and mask.dtype == np.bool_
    assert ids.shape == mask.shape == (case["max_len"],)
    np.testing.assert_array_equal(ids, np.asarray(case["tokens"]))
    np.testing.assert_array_equal(mask, np.asarray(case["mask"]))
    assert int(mask.sum()) == case["num_valid"]
    if "pieces" in case:
        assert [tok._sp.id_to_piece(int(i)) for i in ids[mask]] == case["pieces"]
    if "discretized_state" in case:
        assert discretize_state(np.asarray(case["state"], np.float32)).tolist() == case["discretized_state"]
    assert ("exceeds max length" in caplog.text) == ("overlength" in case["name"])


def test_truncation_warns(tok: Tokenizer, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        ids, mask = tok.tokenize("pick up the red block " * 20)
    assert mask.all() and ids.shape == (48,)
    assert "exceeds max length (48), truncating" in caplog.text


def test_subtask_matches_golden(tok: Tokenizer) -> None:
    golden = np.load(GOLDEN / "text_io.npz")
    ids, mask = tok.tokenize_subtask(SUBTASK_SOURCE_PROMPT)
    np.testing.assert_array_equal(ids[None], golden["elem0_subtask_prompt/tokenized_prompt"])
    np.testing.assert_array_equal(mask[None], golden["elem0_subtask_prompt/tokenized_prompt_mask"])
    assert tok.detokenize(ids) == "Task: pick up the black bowl and place it on the plate. Subtask: "


def test_subtask_cleaning(tok: Tokenizer) -> None:
    """Case, underscores and one trailing punctuation mark do not change the subtask prompt."""
    expected, _ = tok.tokenize_subtask(SUBTASK_SOURCE_PROMPT)
    variant, _ = tok.tokenize_subtask("  Pick_up the BLACK bowl and place it on the plate!\n")
    np.testing.assert_array_equal(variant, expected)
    ids, mask = tok.tokenize_subtask("")
    assert tok.detokenize(ids[mask]) == "Task: . Subtask: "


def test_subtask_truncates(tok: Tokenizer) -> None:
    ids, mask = tok.tokenize_subtask("pick up the red block " * 20)
    assert mask.all() and ids.shape == (48,) and ids[0] == tok.bos_id


def test_missing_file_lists_paths(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENPI_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    with pytest.raises(FileNotFoundError) as err:
        resolve_tokenizer_path(None)
    msg = str(err.value)
    assert str(tmp_path / "data" / "big_vision" / "paligemma_tokenizer.model") in msg
    assert str(tmp_path / "home" / ".cache" / "openpi" / "big_vision" / "paligemma_tokenizer.model") in msg
    assert "gs://big_vision/paligemma_tokenizer.model" in msg
    assert "--tokenizer_path=standin" in msg and "standin_tokenizer.model" in msg

    with pytest.raises(FileNotFoundError, match=r"nowhere\.model"):
        resolve_tokenizer_path(tmp_path / "nowhere.model")


def test_resolves_from_openpi_cache(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cached = tmp_path / "data" / "big_vision" / "paligemma_tokenizer.model"
    cached.parent.mkdir(parents=True)
    cached.write_bytes(STANDIN.read_bytes())
    monkeypatch.setenv("OPENPI_DATA_HOME", str(tmp_path / "data"))
    assert resolve_tokenizer_path(None) == cached
    assert Tokenizer().vocab_size == 1024


def test_url_downloads_into_openpis_cache_layout(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("OPENPI_DATA_HOME", str(tmp_path / "data"))
    memory = fsspec.filesystem("memory")
    bucket = f"tokenizers-{uuid.uuid4().hex[:8]}"
    memory.pipe(f"/{bucket}/big_vision/paligemma_tokenizer.model", STANDIN.read_bytes())
    try:
        url = f"memory://{bucket}/big_vision/paligemma_tokenizer.model"
        assert Tokenizer(url).path == tmp_path / "data" / bucket / "big_vision" / "paligemma_tokenizer.model"
        assert Tokenizer(url).vocab_size == 1024
    finally:
        memory.rm(f"/{bucket}", recursive=True)


def test_gs_url_finds_openpis_cached_copy(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """openpi keeps gs://big_vision/paligemma_tokenizer.model where the cache lookup reads it."""
    cached = tmp_path / "data" / "big_vision" / "paligemma_tokenizer.model"
    cached.parent.mkdir(parents=True)
    cached.write_bytes(STANDIN.read_bytes())
    monkeypatch.setenv("OPENPI_DATA_HOME", str(tmp_path / "data"))
    assert resolve_tokenizer_path("gs://big_vision/paligemma_tokenizer.model") == cached


def test_special_ids(tok: Tokenizer) -> None:
    assert (tok.vocab_size, tok.pad_id, tok.eos_id, tok.bos_id) == (1024, 0, 1, 2)


def test_detokenize_stops_at_eos_and_skips_pad(tok: Tokenizer) -> None:
    ids, _ = tok.tokenize("pick up the black bowl")
    assert tok.detokenize(ids) == "pick up the black bowl\n"
    body = tok._sp.encode("pick up")
    assert tok.detokenize([*body, tok.eos_id, *tok._sp.encode(" the bowl")]) == "pick up"
    assert tok.detokenize(np.asarray([tok.pad_id, *body, tok.pad_id])) == "pick up"


def test_detokenize_drops_unknown_ids(tok: Tokenizer) -> None:
    body = tok._sp.encode("pick up")
    ids = [-5, body[0], tok.vocab_size, 257151, *body[1:], 2**31 - 1]
    assert tok.detokenize(np.asarray(ids, dtype=np.int32)) == "pick up"
    assert tok.detokenize([]) == ""


def test_detokenize_rejects_batches(tok: Tokenizer) -> None:
    with pytest.raises(ValueError, match="1-D"):
        tok.detokenize(np.zeros((2, 3), np.int32))


def test_bundled_standin_resolves_and_loads() -> None:
    path = resolve_tokenizer_path("standin")
    assert path.is_file() and path.parent.name == "assets"
    standin = Tokenizer("standin")
    assert standin.path == path
    assert (standin.vocab_size, standin.pad_id, standin.eos_id, standin.bos_id) == (1024, 0, 1, 2)
    assert standin._sp.unk_id() == 3 and standin._sp.pad_id() == 0 and standin._sp.eos_id() == 1


def test_bundled_standin_round_trips() -> None:
    standin = Tokenizer("standin")
    prompt = "pick up the black bowl and place it on the plate"
    ids, mask = standin.tokenize(prompt)
    assert ids[0] == standin.bos_id and standin.detokenize(ids) == prompt + "\n"
    ids, mask = Tokenizer("standin", max_len=64).tokenize(prompt, np.linspace(-1, 1, 8, dtype=np.float32))
    assert mask.sum() < 64
    assert standin.detokenize(ids) == f"Task: {prompt}, State: 0 36 73 109 146 182 219 255;\nAction: "
    # Byte fallback: text outside the training corpus still round-trips.
    assert standin.detokenize(standin._sp.encode("Grüße, 東京!")) == "Grüße, 東京!"


def test_standin_script_is_deterministic_and_matches_asset() -> None:
    script = load_script("make_standin_tokenizer")
    first = script.train_standin_tokenizer()
    assert first == script.train_standin_tokenizer()
    assert first == resolve_tokenizer_path("standin").read_bytes()
