"""PaliGemma sentencepiece tokenizer with openpi's prompt formats (pi0, pi0.5 discrete state, subtask).

Token ids must match openpi bit for bit: the model was trained on exactly these strings, so any drift in
cleaning, state binning, bos/newline placement or padding changes the prefix the model sees.
"""

import logging
import os
import pathlib
import string
from collections.abc import Sequence

import numpy as np
import sentencepiece

from oxygen_jax import download
from oxygen_jax.errors import MissingFileError

logger = logging.getLogger(__name__)

TOKENIZER_URL = "gs://big_vision/paligemma_tokenizer.model"
_RELATIVE_PATH = pathlib.Path("big_vision") / "paligemma_tokenizer.model"
# `path` value that selects the 1024-piece stand-in bundled with the package (made by
# scripts/make_standin_tokenizer.py), so vocab-1024 configs run without the real tokenizer.
STANDIN = "standin"
_BUNDLED_STANDIN = pathlib.Path(__file__).resolve().parent / "assets" / "standin_tokenizer.model"

# Padding is the literal id 0 (openpi pads with `False`), independent of the sentencepiece model.
PAD_ID = 0
# PaliGemma's end-of-sequence id; generated text ends here.
EOS_ID = 1
STATE_BINS = 256


def resolve_tokenizer_path(path: str | os.PathLike[str] | None = None) -> pathlib.Path:
    """Find the tokenizer model: `path` if given, else openpi's cache ($OPENPI_DATA_HOME, ~/.cache/openpi).

    `path="standin"` selects the bundled 1024-piece stand-in (PaliGemma's special ids, other pieces) for
    small vocab-1024 configs; it takes precedence over a file of that name in the working directory.
    A URL (openpi's `gs://big_vision/paligemma_tokenizer.model`) is downloaded into openpi's cache first,
    as openpi does, unless a copy is there already.
    An explicit `path` is never silently replaced by a cached file: a typo must not load another tokenizer.
    """
    if path == STANDIN:
        candidates = [_BUNDLED_STANDIN]
    elif path is not None and download.is_url(os.fspath(path)):
        candidates = [download.maybe_download(os.fspath(path))]
    elif path is not None:
        candidates = [pathlib.Path(path).expanduser()]
    else:
        candidates = []
        data_home = os.environ.get("OPENPI_DATA_HOME")
        if data_home:
            candidates.append(pathlib.Path(data_home).expanduser() / _RELATIVE_PATH)
        candidates.append(pathlib.Path("~/.cache/openpi").expanduser() / _RELATIVE_PATH)
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    raise MissingFileError(
        f"PaliGemma tokenizer model not found (tried {', '.join(map(str, candidates))}); it is openpi's "
        f"{TOKENIZER_URL} (pass that URL to download it; openpi downloads it into $OPENPI_DATA_HOME or "
        f"~/.cache/openpi, under {_RELATIVE_PATH}); small vocab-1024 configs use --tokenizer_path={STANDIN}, "
        f"the stand-in bundled at {_BUNDLED_STANDIN} (rebuilt by scripts/make_standin_tokenizer.py)"
    )


def clean_prompt(prompt: str) -> str:
    """openpi's prompt cleaning: strip, and turn underscores and newlines into spaces (case is kept)."""
    return prompt.strip().replace("_", " ").replace("\n", " ")


def discretize_state(state: np.ndarray) -> np.ndarray:
    """Map a normalized state in [-1, 1] to 256 bins (0..255), the pi0.5 discrete-state convention."""
    return np.digitize(state, bins=np.linspace(-1, 1, STATE_BINS + 1)[:-1]) - 1


def pad_or_truncate(tokens: Sequence[int], max_len: int) -> tuple[np.ndarray, np.ndarray]:
    """Right-pad with PAD_ID to `max_len` (mask False there), or cut to `max_len` with a warning."""
    if len(tokens) > max_len:
        logger.warning(
            "Token length (%d) exceeds max length (%d), truncating. "
            "Consider increasing the `max_token_len` in your model config if this happens frequently.",
            len(tokens),
            max_len,
        )
    tokens = list(tokens[:max_len])
    num_valid = len(tokens)
    ids = np.full((max_len,), PAD_ID, dtype=np.int32)
    ids[:num_valid] = tokens
    mask = np.arange(max_len) < num_valid
    return ids, mask


class Tokenizer:
    """PaliGemma tokenizer producing fixed-length (ids int32 [max_len], mask bool [max_len]) prompts."""

    def __init__(self, path: str | os.PathLike[str] | None = None, max_len: int = 48) -> None:
        self.path = resolve_tokenizer_path(path)
        self.max_len = max_len
        self._sp = sentencepiece.SentencePieceProcessor(model_proto=self.path.read_bytes())

    @property
    def vocab_size(self) -> int:
        return self._sp.vocab_size()

    @property
    def pad_id(self) -> int:
        return PAD_ID

    @property
    def eos_id(self) -> int:
        return EOS_ID

    @property
    def bos_id(self) -> int:
        return self._sp.bos_id()

    def tokenize(self, prompt: str, state: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """`prompt_tokens` padded or cut to `max_len`."""
        return pad_or_truncate(self.prompt_tokens(prompt, state), self.max_len)

    def prompt_tokens(self, prompt: str, state: np.ndarray | None = None) -> list[int]:
        """Without `state`: pi0 format `<bos>prompt` + `\\n`; with it: the pi0.5 discrete-state format.
        Neither padded nor cut, so a caller can tell whether the prompt fits."""
        cleaned = clean_prompt(prompt)
        if state is None:
            # "\n" is encoded on its own: it is the start-of-answer token.
            return self._sp.encode(cleaned, add_bos=True) + self._sp.encode("\n")
        state_str = " ".join(map(str, discretize_state(np.asarray(state))))
        return self._sp.encode(f"Task: {cleaned}, State: {state_str};\nAction: ", add_bos=True)

    def tokenize_subtask(self, prompt: str) -> tuple[np.ndarray, np.ndarray]:
        """Prompt that asks the language head for a subtask: `<bos>Task: {text}. Subtask: `.

        `text` is the cleaned, lower-cased prompt with one trailing punctuation mark replaced by ".".
        Over-long prompts are truncated like `tokenize`.
        """
        cleaned = clean_prompt(prompt.lower())
        if cleaned and cleaned[-1] in string.punctuation:
            cleaned = cleaned[:-1]
        tokens = self._sp.encode(f"Task: {cleaned}. Subtask: ", add_bos=True)
        return pad_or_truncate(tokens, self.max_len)

    def tokenize_task(self, instruction: str) -> list[int]:
        """A language task's suffix, appended after the observation's prompt: `{instruction}` + `\\n`
        (no BOS: it continues the prompt; the `\\n` starts the answer, as in `tokenize`)."""
        return self._sp.encode(clean_prompt(instruction)) + self._sp.encode("\n")

    def tokenize_target(self, text: str) -> list[int]:
        """A training target the language head learns to generate after the prompt: `{text}` + EOS (no
        BOS: it continues the prompt, whose trailing `\\n` starts the answer). Decoding stops at the EOS."""
        return [*self._sp.encode(clean_prompt(text)), EOS_ID]

    def detokenize(self, ids: Sequence[int] | np.ndarray) -> str:
        """Text of a 1-D id sequence up to the first EOS, without padding.

        Ids outside the vocabulary (negative or >= vocab_size, which random-init models emit) are dropped.
        """
        arr = np.asarray(ids).astype(np.int64)
        if arr.ndim != 1:
            raise ValueError(f"detokenize expects a 1-D id sequence, got shape {arr.shape}")
        ids_list = arr.tolist()
        if EOS_ID in ids_list:
            ids_list = ids_list[: ids_list.index(EOS_ID)]
        return self._sp.decode([i for i in ids_list if i != PAD_ID and 0 <= i < self.vocab_size])
