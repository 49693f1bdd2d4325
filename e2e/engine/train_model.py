"""Trains kvq's probe model: a tiny Llama that retrieves needles and writes JSON records.

Random weights make every quality probe meaningless; this model has real skills that a
damaged KV cache can break, and is small enough to train on two CPU cores in minutes:
4 layers, hidden 128, 4 query heads and 2 KV heads of head_dim 32 (the CPU backend's
FP8 KV cache needs head_dim divisible by 32), about 0.9 M parameters, a byte-level BPE
tokenizer trained on the same synthetic text. Tasks, from `kvq.probe.tasks` (the probe's
own formats, with other seeds than the probe uses):

- needle: filler with one fact "The secret number of the KEY is NNNN." hidden at a
  random depth among distractor facts, then the question; the answer copies the value;
- json: a record in words and a schema; the answer is the record as one JSON object;
- continuation: filler to continue (plain language modelling).

Deterministic for a given CPU and torch build (fixed seeds, fixed steps, one thread
order); a different CPU may round differently, so scores, not bits, are what the engine
tier relies on. Runs in the engine venv (torch, transformers, tokenizers):

    <engine-venv>/bin/python e2e/engine/train_model.py           # cached dir, trained if absent
    <engine-venv>/bin/python e2e/engine/train_model.py --check   # cached dir, or exit 1
    <engine-venv>/bin/python e2e/engine/train_model.py --out DIR # train into DIR

The cache is `${KVQ_CACHE:-~/.cache/kvq}/models/kvq-probe-llama-<hash>`, the hash of this
script and of `kvq/probe/tasks.py`: changing either trains a new model.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import math
import os
import random
import re
import shutil
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
TASKS = REPO / "operator" / "kvq" / "probe" / "tasks.py"
sys.path.insert(0, str(REPO / "operator"))

from kvq.probe import tasks  # noqa: E402

BOS, EOS, UNK = "<s>", "</s>", "<unk>"
SPECIAL_TOKENS = (UNK, BOS, EOS)
MODEL_NAME = "kvq-probe-llama"
COMPLETE_MARKER = ".complete"


@dataclass(frozen=True)
class Recipe:
    """Everything that decides the weights."""

    seed: int = 20261201
    vocab_size: int = 1024
    hidden_size: int = 128
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 32
    num_hidden_layers: int = 4
    intermediate_size: int = 384
    # What vLLM is told (max_position_embeddings); training covers all of it.
    max_model_len: int = 512
    steps: int = 1500
    batch_size: int = 16
    # Longest example early in training; grows to max_model_len by curriculum_end.
    curriculum_start_len: int = 128
    curriculum_end: float = 0.6
    learning_rate: float = 2e-3
    warmup_steps: int = 60
    # Loss weight of prompt tokens: none, or the unpredictable filler would drown the
    # answers' gradient (the continuation task trains on all its tokens).
    prompt_loss_weight: float = 0.0
    # Shares of the task mix.
    needle_share: float = 0.5
    json_share: float = 0.2
    copy_share: float = 0.15
    # One thread: deterministic, and two OpenMP threads on two busy cores ran 10x slower.
    threads: int = 1


def cache_key() -> str:
    digest = hashlib.sha256(Path(__file__).read_bytes() + TASKS.read_bytes())
    return digest.hexdigest()[:12]


def cached_dir() -> Path:
    cache = Path(os.environ.get("KVQ_CACHE", Path.home() / ".cache" / "kvq"))
    return cache / "models" / f"{MODEL_NAME}-{cache_key()}"


# --- tokenizer --------------------------------------------------------------------------


def tokenizer_corpus(rng: random.Random) -> list[str]:
    """Text that holds every word, digit and symbol the tasks use."""
    corpus = [tasks.continuation_prompt(rng.randrange(1 << 30), 12) for _ in range(2000)]
    corpus += [
        tasks.needle_case(rng.randrange(1 << 30), 300, rng.random()).prompt for _ in range(3000)
    ]
    for _ in range(2000):
        case = tasks.json_case(rng.randrange(1 << 30))
        corpus.append(case.prompt + tasks.json_answer(case))
    return corpus


def train_tokenizer(directory: Path, recipe: Recipe, rng: random.Random) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE(unk_token=UNK))
    # GPT-2's byte-level split: " 47" is one piece, and frequent enough to be one token,
    # so retrieving a needle is copying one token.
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=recipe.vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(tokenizer_corpus(rng), trainer=trainer)
    tokenizer.save(str(directory / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "unk_token": UNK,
        "model_max_length": recipe.max_model_len,
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    return tokenizer


# --- data ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Example:
    ids: list[int]
    # 1 where the token is part of the answer, else 0.
    answer: list[int]


def encode_example(tokenizer: Any, prompt: str, answer: str, eos: int) -> Example:
    return encode_dialogue(tokenizer, [(prompt, answer)], eos)


def encode_dialogue(tokenizer: Any, turns: list[tuple[str, str]], eos: int) -> Example:
    """Prompt and answer pieces in turn; only answers (and the final EOS) are trained."""
    ids: list[int] = []
    answer: list[int] = []
    for prompt, reply in turns:
        prompt_ids, reply_ids = tokenizer.encode(prompt).ids, tokenizer.encode(reply).ids
        ids += prompt_ids + reply_ids
        answer += [0] * len(prompt_ids) + [1] * len(reply_ids)
    return Example([*ids, eos], [*answer, 1])


_FACT = re.compile(r"The secret number of the (\w+) is (\d+)\.")


def needle_example(tokenizer: Any, case: tasks.NeedleCase, rng: random.Random, eos: int) -> Example:
    """The haystack, then a question on every fact in it: more answers per sequence."""
    haystack = case.prompt[: case.prompt.index("\nQuestion:")]
    facts = _FACT.findall(haystack)
    rng.shuffle(facts)
    turns = [(haystack + tasks.needle_question(facts[0][0]), f" {facts[0][1]}.")]
    turns += [(tasks.needle_question(key), f" {value}.") for key, value in facts[1:]]
    return encode_dialogue(tokenizer, turns, eos)


# Characters a token holds in filler, about (measured: 4.3); facts and question take
# about 70 tokens more.
CHARS_PER_TOKEN = 4.0
NEEDLE_OVERHEAD_TOKENS = 80


def sample_example(
    tokenizer: Any, recipe: Recipe, rng: random.Random, eos: int, max_len: int
) -> Example:
    """One example of a random task, at most about `max_len` tokens."""
    draw = rng.random()
    seed = rng.randrange(1 << 30)
    if draw < recipe.needle_share:
        most = max(41, int((max_len - NEEDLE_OVERHEAD_TOKENS) * CHARS_PER_TOKEN))
        case = tasks.needle_case(seed, rng.randrange(40, most), rng.random(), rng.randrange(5))
        example = needle_example(tokenizer, case, rng, eos)
    elif draw < recipe.needle_share + recipe.json_share:
        case_json = tasks.json_case(seed)
        example = encode_example(tokenizer, case_json.prompt, tasks.json_answer(case_json), eos)
    elif draw < recipe.needle_share + recipe.json_share + recipe.copy_share:
        prompt, answer = tasks.copy_example(seed, rng.randrange(4, max(5, max_len // 5)))
        example = encode_example(tokenizer, prompt, answer, eos)
    else:
        text = tasks.continuation_prompt(seed, rng.randrange(2, max(3, max_len // 12)))
        ids = tokenizer.encode(text).ids
        cut = len(tasks.CONTINUATION_INSTRUCTION.split())
        example = Example(ids, [0] * cut + [1] * (len(ids) - cut))
    if len(example.ids) > recipe.max_model_len:  # rare: draw again rather than cut a fact
        return sample_example(tokenizer, recipe, rng, eos, max_len)
    return example


def batch_tensors(examples: list[Example], recipe: Recipe, pad: int) -> tuple[Any, Any, Any]:
    import torch

    width = max(len(e.ids) for e in examples)
    ids = torch.full((len(examples), width), pad, dtype=torch.long)
    mask = torch.zeros((len(examples), width), dtype=torch.long)
    weights = torch.zeros((len(examples), width), dtype=torch.float32)
    for row, example in enumerate(examples):
        n = len(example.ids)
        ids[row, :n] = torch.tensor(example.ids)
        mask[row, :n] = 1
        weights[row, :n] = torch.tensor(
            [1.0 if a else recipe.prompt_loss_weight for a in example.answer]
        )
    return ids, mask, weights


# --- model ---------------------------------------------------------------------------------


def model_config(recipe: Recipe, vocab_size: int) -> dict[str, Any]:
    return {
        "architectures": ["LlamaForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": SPECIAL_TOKENS.index(BOS),
        "eos_token_id": SPECIAL_TOKENS.index(EOS),
        "head_dim": recipe.head_dim,
        "hidden_act": "silu",
        "hidden_size": recipe.hidden_size,
        "initializer_range": 0.02,
        "intermediate_size": recipe.intermediate_size,
        "max_position_embeddings": recipe.max_model_len,
        "mlp_bias": False,
        "model_type": "llama",
        "num_attention_heads": recipe.num_attention_heads,
        "num_hidden_layers": recipe.num_hidden_layers,
        "num_key_value_heads": recipe.num_key_value_heads,
        "rms_norm_eps": 1e-05,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "vocab_size": vocab_size,
    }


def learning_rate(recipe: Recipe, step: int) -> float:
    if step < recipe.warmup_steps:
        return recipe.learning_rate * (step + 1) / recipe.warmup_steps
    progress = (step - recipe.warmup_steps) / max(1, recipe.steps - recipe.warmup_steps)
    return recipe.learning_rate * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * progress)))


def train(recipe: Recipe, out: Path) -> dict[str, Any]:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(recipe.seed)
    torch.set_num_threads(recipe.threads)
    torch.use_deterministic_algorithms(True)
    rng = random.Random(recipe.seed)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer(out, recipe, rng)
    vocab_size = int(tokenizer.get_vocab_size())
    eos = SPECIAL_TOKENS.index(EOS)
    config = model_config(recipe, vocab_size)
    model = LlamaForCausalLM(LlamaConfig(**config, attn_implementation="sdpa"))
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=recipe.learning_rate, betas=(0.9, 0.98), weight_decay=0.01
    )
    started = time.monotonic()
    history: list[dict[str, float]] = []
    model.train()
    for step in range(recipe.steps):
        # One length bound per batch: little padding, and every length is trained; short
        # first (fast steps, and copying is learnt at short range before long).
        grown = min(1.0, step / (recipe.curriculum_end * recipe.steps))
        cap = round(
            recipe.curriculum_start_len
            + grown * (recipe.max_model_len - recipe.curriculum_start_len)
        )
        max_len = rng.randrange(64, cap + 1)
        examples = [
            sample_example(tokenizer, recipe, rng, eos, max_len) for _ in range(recipe.batch_size)
        ]
        ids, mask, weights = batch_tensors(examples, recipe, eos)
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(recipe, step)
        logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1]
        losses = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1), reduction="none"
        ).view(ids.shape[0], -1)
        target_weights = weights[:, 1:]
        loss = (losses * target_weights).sum() / target_weights.sum()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if step % 50 == 0 or step == recipe.steps - 1:
            answer_loss = float(
                (losses.detach() * (target_weights == 1)).sum() / (target_weights == 1).sum()
            )
            entry = {"step": step, "loss": float(loss.detach()), "answerLoss": answer_loss,
                     "elapsedS": round(time.monotonic() - started, 1)}  # fmt: skip
            history.append(entry)
            print(json.dumps(entry), file=sys.stderr, flush=True)
    model.eval()
    model.config.eos_token_id = eos
    scores = evaluate(model, tokenizer)
    print(json.dumps(scores), file=sys.stderr, flush=True)
    model.to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
    # save_pretrained writes transformers' own config; keep ours, the one vLLM is given.
    (out / "config.json").write_text(
        json.dumps({**config, "dtype": "bfloat16"}, indent=2, sort_keys=True) + "\n"
    )
    (out / "generation_config.json").unlink(missing_ok=True)
    return {
        "trainSeconds": round(time.monotonic() - started, 1),
        "parameters": sum(p.numel() for p in model.parameters()),
        "history": history,
        "heldOut": scores,
    }


# Held-out checks after training (the probe's seeds are others again).
EVAL_SEED = 7_000_000
EVAL_FILLER_CHARS = (400, 1000, 1600)


def greedy(model: Any, tokenizer: Any, prompt: str, max_new_tokens: int) -> str:
    import torch

    ids = torch.tensor([tokenizer.encode(prompt).ids])
    with torch.no_grad():
        out = model.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
            do_sample=False, pad_token_id=SPECIAL_TOKENS.index(EOS),
        )  # fmt: skip
    return str(tokenizer.decode(out[0, ids.shape[1] :].tolist(), skip_special_tokens=True))


def evaluate(model: Any, tokenizer: Any) -> dict[str, Any]:
    """Needle accuracy per filler length and JSON exact-match share, greedy, in torch."""
    needle: dict[str, float] = {}
    for chars in EVAL_FILLER_CHARS:
        hits = 0
        cases = [
            tasks.needle_case(EVAL_SEED + 10 * chars + i, chars, depth)
            for i, depth in enumerate(tasks.NEEDLE_DEPTHS * 2)
        ]
        for case in cases:
            hits += greedy(model, tokenizer, case.prompt, 6).strip().startswith(case.value)
        needle[str(chars)] = hits / len(cases)
    exact = 0
    json_cases = [tasks.json_case(EVAL_SEED + i) for i in range(10)]
    for case_json in json_cases:
        text = greedy(model, tokenizer, case_json.prompt, 64)
        with contextlib.suppress(ValueError):
            exact += json.loads(text) == case_json.expected
    return {"needleAccuracyByFillerChars": needle, "jsonExact": exact / len(json_cases)}


def write_model(out: Path, recipe: Recipe) -> Path:
    """Trains into a temporary sibling, then renames: a dir that exists is complete."""
    staging = out.with_name(out.name + f".tmp-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    summary = train(recipe, staging)
    import torch
    import transformers

    training = {
        "recipe": asdict(recipe),
        "cacheKey": cache_key(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        **summary,
    }
    (staging / "training.json").write_text(json.dumps(training, indent=2) + "\n")
    (staging / COMPLETE_MARKER).touch()
    shutil.rmtree(out, ignore_errors=True)
    staging.rename(out)
    return out


def ensure_cached(recipe: Recipe) -> Path:
    out = cached_dir()
    out.parent.mkdir(parents=True, exist_ok=True)
    # One trainer at a time: the engine tier and a developer may ask at once.
    with (out.parent / f".{out.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (out / COMPLETE_MARKER).exists():
            write_model(out, recipe)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="print the cached dir or exit 1")
    parser.add_argument("--out", type=Path, help="train into this directory (no cache)")
    parser.add_argument("--steps", type=int, help="override the recipe's steps (experiments)")
    args = parser.parse_args()
    recipe = Recipe() if args.steps is None else Recipe(steps=args.steps)
    if args.check:
        out = cached_dir()
        if not (out / COMPLETE_MARKER).exists():
            sys.exit(1)
        print(out)
    elif args.out is not None:
        print(write_model(args.out, recipe))
    else:
        print(ensure_cached(recipe))


if __name__ == "__main__":
    main()
