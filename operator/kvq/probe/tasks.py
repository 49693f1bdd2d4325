"""The probe's prompts and expected answers, generated from fixed seeds.

Standard library only: the engine tier's training script imports this module to teach
its tiny model these formats (with other seeds than the probe's), so a probe of that
model measures what the KV cache does to a skill the model really has.

Prompts are plain completions (no chat template) so they mean the same to any
OpenAI-compatible server:

- needle: filler sentences with one fact hidden at a depth, a few distractor facts of
  the same shape elsewhere, and a question at the end whose answer is the fact's value;
- json: a record in words and a schema; the answer is the record as one JSON object;
- continuation: a few filler sentences to continue (the repetition suite).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Any

# Filler: varied, grammatical, meaningless; nothing in it looks like a fact.
_ADJECTIVES = (
    "old", "quiet", "bright", "small", "distant", "green", "narrow", "warm", "early",
    "heavy", "silver", "gentle", "empty", "broad", "pale", "busy",
)  # fmt: skip
_NOUNS = (
    "river", "garden", "window", "bridge", "market", "lantern", "meadow", "harbor",
    "orchard", "tower", "valley", "station", "library", "forest", "village", "road",
)  # fmt: skip
_VERBS = (
    "rests", "waits", "turns", "shines", "leans", "drifts", "grows", "stands", "fades",
    "opens", "hums", "settles",
)  # fmt: skip
_PLACES = (
    "hill", "shore", "square", "field", "gate", "wall", "lake", "path", "farm", "mill",
    "camp", "yard",
)  # fmt: skip
_TIMES = ("at dawn", "in the evening", "after the rain", "in winter", "at noon", "by night")
# Needle keys: animals, one word each, never used in filler.
NEEDLE_KEYS = (
    "falcon", "otter", "badger", "heron", "lynx", "walrus", "beaver", "raven", "bison",
    "gecko", "jackal", "koala", "lemur", "marmot", "newt", "ocelot", "panda", "quail",
    "salmon", "tapir", "urchin", "viper", "weasel", "yak", "zebra", "alpaca", "camel",
    "dingo", "ferret", "gibbon", "hyena", "ibis", "jaguar", "kiwi", "llama", "moose",
    "narwhal", "osprey", "pelican", "rabbit", "stork", "toucan", "vulture", "wombat",
    "coyote", "donkey", "eagle", "finch",
)  # fmt: skip

NEEDLE_DEPTHS = (0.1, 0.3, 0.5, 0.7, 0.9)
NEEDLE_DISTRACTORS = 3
CONTINUATION_INSTRUCTION = "Continue the text.\n"


def filler_sentence(rng: random.Random) -> str:
    """One sentence of filler text."""
    adjective, noun, verb = rng.choice(_ADJECTIVES), rng.choice(_NOUNS), rng.choice(_VERBS)
    place, other = rng.choice(_PLACES), rng.choice(_ADJECTIVES)
    template = rng.randrange(3)
    if template == 0:
        return f"The {adjective} {noun} {verb} near the {other} {place}."
    if template == 1:
        return f"A {adjective} {noun} {verb} {rng.choice(_TIMES)}."
    return f"The {noun} by the {place} {verb} {rng.choice(_TIMES)}, {adjective} and {other}."


def filler(rng: random.Random, sentences: int) -> list[str]:
    return [filler_sentence(rng) for _ in range(sentences)]


def needle_value(rng: random.Random) -> str:
    """A two-digit number: one in 90 by chance, and a copy a small model can learn."""
    return str(rng.randrange(10, 100))


def needle_fact(key: str, value: str) -> str:
    return f"The secret number of the {key} is {value}."


def needle_question(key: str) -> str:
    """Asked after the haystack; the expected completion is ` VALUE`."""
    return (
        f"\nQuestion: What is the secret number of the {key}?\n"
        f"Answer: The secret number of the {key} is"
    )


@dataclass(frozen=True)
class NeedleCase:
    """One haystack: `prompt` hides `value` for `key` at `depth` of its filler."""

    prompt: str
    key: str
    value: str
    depth: float
    # Characters of filler in the prompt (the facts and the question come on top).
    filler_chars: int


def filler_of_length(rng: random.Random, chars: int) -> list[str]:
    """Filler sentences, at least one, until they hold about `chars` characters."""
    sentences = [filler_sentence(rng)]
    total = len(sentences[0])
    while total < chars:
        sentences.append(filler_sentence(rng))
        total += len(sentences[-1]) + 1
    return sentences


def needle_case(
    seed: int, filler_chars: int, depth: float, distractors: int = NEEDLE_DISTRACTORS
) -> NeedleCase:
    """A haystack of about `filler_chars` characters of filler, the fact at `depth` (0..1).

    Sized in characters, not sentences: a server's token count follows characters
    closely, so a length in tokens maps to one in characters (see the runner's
    calibration). Distractor facts (other keys, other values) sit at random other
    places, so the answer needs the right key, not the only number in sight.
    """
    rng = random.Random(seed)
    keys = rng.sample(NEEDLE_KEYS, distractors + 1)
    key, value = keys[0], needle_value(rng)
    sentences = filler_of_length(rng, filler_chars)
    count = len(sentences)
    filler_total = sum(map(len, sentences)) + count - 1
    facts: list[tuple[int, str]] = [(round(depth * count), needle_fact(key, value))]
    for other in keys[1:]:
        facts.append((rng.randrange(count + 1), needle_fact(other, needle_value(rng))))
    # Insert from the back so earlier positions stay valid; the needle wins ties (first).
    for position, fact in sorted(facts, key=lambda item: item[0], reverse=True):
        sentences.insert(position, fact)
    prompt = " ".join(sentences) + needle_question(key)
    return NeedleCase(prompt, key, value, depth, filler_total)


# JSON records: (field, JSON type, values to draw from).
_NAMES = ("Alice", "Bruno", "Chen", "Dara", "Emil", "Farah", "Goran", "Hana", "Ivo", "Jonas")
_CITIES = ("Paris", "Lima", "Oslo", "Kyoto", "Cairo", "Quito", "Perth", "Turin", "Accra")
_COLORS = ("red", "blue", "green", "black", "white", "amber", "violet")
_TAGS = ("music", "film", "sport", "art", "food", "travel", "science", "books")


@dataclass(frozen=True)
class JsonCase:
    """One JSON task: the prompt, the object it asks for, and its JSON Schema."""

    prompt: str
    expected: dict[str, Any]
    schema: dict[str, Any]
    kind: str


def _person(rng: random.Random) -> dict[str, Any]:
    return {
        "name": rng.choice(_NAMES),
        "age": rng.randrange(18, 90),
        "city": rng.choice(_CITIES),
    }


def _product(rng: random.Random) -> dict[str, Any]:
    return {
        "sku": f"{rng.choice('ABCDEFGH')}{rng.choice('KLMNPRST')}-{rng.randrange(100, 1000)}",
        "color": rng.choice(_COLORS),
        "price": rng.randrange(1, 500),
        "in_stock": rng.random() < 0.5,
    }


def _event(rng: random.Random) -> dict[str, Any]:
    return {
        "title": f"{rng.choice(_ADJECTIVES).title()} {rng.choice(_NOUNS).title()}",
        "year": rng.randrange(1950, 2030),
        "tags": rng.sample(_TAGS, rng.randrange(1, 4)),
    }


_RECORDS = {"person": _person, "product": _product, "event": _event}
_JSON_TYPES = {str: "string", bool: "boolean", int: "integer", list: "array"}


def _json_type(value: object) -> str:
    return _JSON_TYPES[type(value)]


def json_schema(example: dict[str, Any]) -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) every record of this kind must satisfy."""
    properties: dict[str, Any] = {}
    for field, value in example.items():
        kind = _json_type(value)
        properties[field] = (
            {"type": "array", "items": {"type": "string"}, "minItems": 1}
            if kind == "array"
            else {"type": kind}
        )
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "properties": properties,
        "required": list(example),
        "additionalProperties": False,
    }


def _describe(value: object) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list):
        return " and ".join(str(item) for item in value)
    return str(value)


def json_case(seed: int, kind: str | None = None) -> JsonCase:
    rng = random.Random(seed)
    kind = kind or rng.choice(sorted(_RECORDS))
    record = _RECORDS[kind](rng)
    shape = ", ".join(f'"{field}": {_json_type(value)}' for field, value in record.items())
    words = ", ".join(f"{field} {_describe(value)}" for field, value in record.items())
    prompt = (
        "Write the record as one JSON object that matches the schema.\n"
        f"Schema: {{{shape}}}\n"
        f"Record: {kind} with {words}\n"
        "JSON:"
    )
    return JsonCase(prompt, record, json_schema(record), kind)


def json_answer(case: JsonCase) -> str:
    """The completion a perfect model gives: one line of JSON after a space."""
    return " " + json.dumps(case.expected)


def copy_example(seed: int, words: int) -> tuple[str, str]:
    """(prompt, answer) of a plain copy task: not probed, but it teaches a small model the
    attention pattern (find the earlier occurrence, copy what follows) that retrieval needs."""
    rng = random.Random(seed)
    vocabulary = _ADJECTIVES + _NOUNS + _VERBS + _PLACES + NEEDLE_KEYS
    text = " ".join(rng.choice(vocabulary) for _ in range(words))
    return f"Copy the words.\n{text}\nCopy:", f" {text}"


def continuation_prompt(seed: int, sentences: int = 3) -> str:
    rng = random.Random(seed)
    return CONTINUATION_INSTRUCTION + " ".join(filler(rng, sentences))
