"""Build the 1024-piece sentencepiece stand-in that small configs load with `tokenizer_path="standin"`.

The real PaliGemma tokenizer (vocab 257152) is not redistributable, so vocab-1024 configs need a model of
their own that ships with the package. Its special ids (pad 0, eos 1, bos 2, unk 3) and byte fallback match
PaliGemma's, so prompt formats, padding and detokenization behave the same; only the pieces differ.
The corpus is generated here and training is single-threaded, so reruns give byte-identical files.

    .venv/bin/python scripts/make_standin_tokenizer.py [--out PATH]
"""

import io
import itertools
import pathlib
import random
import string

import sentencepiece
from absl import app, flags

_DEFAULT_OUT = (
    pathlib.Path(__file__).resolve().parents[1] / "src" / "oxygen_jax" / "assets" / "standin_tokenizer.model"
)
_OUT = flags.DEFINE_string("out", str(_DEFAULT_OUT), "Where to write the sentencepiece model.")

VOCAB_SIZE = 1024
# Fixed seed: the corpus (and with one training thread, the model) must not change between runs.
_SEED = 1024

_COLORS = ("black", "white", "red", "green", "blue", "yellow", "orange", "purple", "pink", "brown", "grey")
_OBJECTS = (
    "bowl", "plate", "mug", "cup", "block", "cube", "sponge", "towel", "bottle", "can", "spoon", "fork",
    "knife", "box", "basket", "book", "pan", "pot", "lid", "marker", "cloth", "banana", "apple", "carrot",
    "ketchup", "butter", "milk", "orange juice", "cream cheese", "tomato sauce", "salad dressing",
    "chocolate pudding", "alphabet soup", "moka pot", "wine bottle", "shirt", "sock", "tray", "bag",
)  # fmt: skip
_PLACES = (
    "on the plate", "in the basket", "into the bowl", "on the top shelf", "on the bottom shelf",
    "in the top drawer", "into the middle drawer", "on the left side of the table",
    "on the right of the sink", "next to the stove", "behind the box", "in front of the mug",
    "on the cabinet", "inside the microwave", "on the tray", "in the sink", "on the stove",
    "on top of the red block", "between the two cups",
)  # fmt: skip
_GRASP_VERBS = ("pick up", "grasp", "grab", "lift", "take", "hold", "move", "push", "pull", "slide", "rotate")
_PLACE_VERBS = ("put", "place", "set", "drop", "stack", "move", "push")
_FIXTURES = ("drawer", "cabinet door", "microwave", "fridge", "oven", "laptop", "box", "gripper")
_FIXTURE_POSITIONS = ("top", "middle", "bottom", "left", "right")
_SWITCHES = ("stove", "faucet", "lamp", "burner", "light")
_CHORES = (
    "fold the towel in half", "wipe the table with the sponge", "pour the water into the cup",
    "hang the mug on the rack", "sort the blocks by color", "clean up the table", "unfold the shirt",
    "stack the cups on each other", "put all the toys in the basket", "throw the trash in the bin",
    "flip the pancake", "close the lid of the pot", "tidy up the kitchen", "load the dishwasher",
)  # fmt: skip
_SUBTASKS = (
    "move the gripper to the {o}", "reach for the {o}", "grasp the {o}", "lift the {o}", "carry the {o}",
    "move to the {p}", "lower the {o}", "release the {o}", "open the gripper", "close the gripper",
    "move back to the start", "go home", "done",
)  # fmt: skip
_FLOURISHES = ("", ".", "!", "?", " please.", " now!", ", then stop.", " (carefully)", " - quickly")


def _objects(rng: random.Random) -> list[str]:
    """Bare and colored objects, with a random fraction of the colored ones to keep the corpus small."""
    colored = [f"{c} {o}" for c, o in itertools.product(_COLORS, _OBJECTS)]
    return list(_OBJECTS) + rng.sample(colored, len(colored) // 3)


def _instructions(rng: random.Random) -> list[str]:
    """Task prompts: grasp/place/fixture/switch/chore templates with varied case and punctuation.

    No underscores or newlines: prompt cleaning turns them into spaces before encoding.
    """
    objects = _objects(rng)
    lines: list[str] = []
    for verb, obj in itertools.product(_GRASP_VERBS, objects):
        lines.append(f"{verb} the {obj}")
    for obj, place in itertools.product(objects, _PLACES):
        lines.append(f"pick up the {obj} and place it {place}")
        lines.append(f"{rng.choice(_PLACE_VERBS)} the {obj} {place}")
    for action, pos, fixture in itertools.product(("open", "close"), _FIXTURE_POSITIONS, _FIXTURES):
        lines.append(f"{action} the {pos} {fixture}")
    for state, switch in itertools.product(("on", "off"), _SWITCHES):
        lines.append(f"turn {state} the {switch}")
        lines.append(f"turn {state} the {switch} and put the {rng.choice(objects)} on it")
    lines.extend(_CHORES)
    decorated = []
    for line in lines:
        cased = line[0].upper() + line[1:] if rng.random() < 0.2 else line
        decorated.append(cased + rng.choice(_FLOURISHES))
    return decorated


def _state(rng: random.Random) -> str:
    """Space-separated discretized state bins, as in pi0.5's `State: ...;` field."""
    return " ".join(str(rng.randrange(256)) for _ in range(rng.randrange(6, 33)))


def build_corpus() -> list[str]:
    """Robot-instruction text shaped like the prompts the tokenizer sees: pi0, pi0.5 and subtask formats."""
    rng = random.Random(_SEED)
    instructions = _instructions(rng)
    corpus = list(instructions)
    for prompt in rng.sample(instructions, len(instructions) // 2):
        corpus.append(f"Task: {prompt}, State: {_state(rng)};\nAction: ")
    for prompt in rng.sample(instructions, len(instructions) // 4):
        subtask = rng.choice(_SUBTASKS).format(o=rng.choice(_OBJECTS), p=rng.choice(_PLACES)[3:])
        corpus.append(f"Task: {prompt.lower().rstrip(string.punctuation)}. Subtask: {subtask}")
    corpus.append(" ".join(str(i) for i in range(256)))
    corpus.append("0123456789 .,;:!?'\"()[]{}<>/\\|-_+=*&^%$#@~`\n\t")
    return corpus


def train_standin_tokenizer() -> bytes:
    """Serialized sentencepiece model trained in memory on `build_corpus()`."""
    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(build_corpus()),
        model_writer=model,
        model_type="bpe",
        vocab_size=VOCAB_SIZE,
        byte_fallback=True,
        split_digits=True,
        pad_id=0,
        eos_id=1,
        bos_id=2,
        unk_id=3,
        normalization_rule_name="identity",
        add_dummy_prefix=False,
        remove_extra_whitespaces=False,
        allow_whitespace_only_pieces=True,
        character_coverage=1.0,
        num_threads=1,
        max_sentencepiece_length=16,
    )
    return model.getvalue()


def main(argv: list[str]) -> None:
    del argv
    out = pathlib.Path(_OUT.value)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(train_standin_tokenizer())
    print(f"Wrote {out} ({out.stat().st_size} bytes)")


if __name__ == "__main__":
    app.run(main)
