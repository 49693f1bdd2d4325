"""Writes a tiny Llama model directory that real vLLM can serve with dummy weights.

The directory holds `config.json` and a tokenizer trained on the spot; no weights:
vLLM is started with `--load-format dummy`. The shape (head_dim above all) decides
what the CPU backend accepts, which is the point: head_dim 80 makes vLLM refuse an
FP8 KV cache at start, head_dim 32 serves FP8, head_dim 16 dies at the first request.

Runs under any Python 3.11 for the shapes; training the tokenizer needs the
`tokenizers` library, which the engine venv (e2e/engine/install.sh) has:

    <engine-venv>/bin/python e2e/engine/tiny_model.py head80 /tmp/tiny-head80
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

BOS, EOS, UNK = "<s>", "</s>", "<unk>"
# Token ids of the special tokens: the trainer numbers them first, in this order.
SPECIAL_TOKENS = (UNK, BOS, EOS)

# Enough text for a byte-level BPE to learn some merges; content is irrelevant
# (weights are random), only that it is fixed, so the vocabulary is reproducible.
CORPUS = [
    "The KV cache grows with batch size, context length, layers and hidden size.",
    "Storing the cache in eight bits instead of sixteen halves its memory.",
    "A quantized cache buys longer context and more concurrent requests.",
    "The engine rejects a dtype the attention backend cannot run.",
    "Fall back to auto when the model architecture rejects fp8.",
    "Hello world. The quick brown fox jumps over the lazy dog.",
    "0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 32 64 128 256 512 1024",
]


@dataclass(frozen=True)
class TinyShape:
    """The architecture numbers that matter to the KV cache and the CPU backend."""

    name: str
    head_dim: int
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    num_hidden_layers: int = 2
    intermediate_size: int = 128
    max_position_embeddings: int = 2048

    @property
    def hidden_size(self) -> int:
        return self.head_dim * self.num_attention_heads

    def kv_bytes_per_token(self, bytes_per_element: int) -> int:
        """K and V, every layer, every KV head: what one cached token costs."""
        return (
            2
            * self.num_hidden_layers
            * self.num_key_value_heads
            * self.head_dim
            * bytes_per_element
        )


PRESETS: dict[str, TinyShape] = {
    # The shape of tests/fixtures/vllm/cpu-tiny-head80.config.json (its vocab size is its
    # tokenizer's, trained on other text).
    "head80": TinyShape(name="head80", head_dim=80),
    "head32": TinyShape(name="head32", head_dim=32),
    "head16": TinyShape(name="head16", head_dim=16),
}


def render_config(shape: TinyShape, vocab_size: int) -> dict[str, object]:
    """The Hugging Face config.json of a Llama with this shape."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": SPECIAL_TOKENS.index(BOS),
        "dtype": "bfloat16",
        "eos_token_id": SPECIAL_TOKENS.index(EOS),
        "head_dim": shape.head_dim,
        "hidden_act": "silu",
        "hidden_size": shape.hidden_size,
        "initializer_range": 0.02,
        "intermediate_size": shape.intermediate_size,
        "max_position_embeddings": shape.max_position_embeddings,
        "mlp_bias": False,
        "model_type": "llama",
        "num_attention_heads": shape.num_attention_heads,
        "num_hidden_layers": shape.num_hidden_layers,
        "num_key_value_heads": shape.num_key_value_heads,
        "pad_token_id": None,
        "pretraining_tp": 1,
        "rms_norm_eps": 1e-06,
        "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
        "tie_word_embeddings": False,
        "use_cache": True,
        "vocab_size": vocab_size,
    }


def train_tokenizer(directory: Path, vocab_size: int = 384) -> int:
    """Trains a byte-level BPE on CORPUS, saves it for transformers; returns its size.

    The alphabet is only what CORPUS holds (printable ASCII), not all 256 bytes: a lone
    byte token decodes to "" in vLLM's incremental detokenizer, and random weights can
    pick one again and again, so a completion would come back empty.
    """
    # Engine venv only (a vLLM dependency); the project venv never trains a tokenizer.
    from tokenizers import (  # type: ignore[import-not-found]
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
        trainers,
    )

    tokenizer = Tokenizer(models.BPE(unk_token=UNK))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        show_progress=False,
    )
    tokenizer.train_from_iterator(CORPUS, trainer=trainer)
    tokenizer.save(str(directory / "tokenizer.json"))
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "unk_token": UNK,
        "model_max_length": 2048,
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2))
    return int(tokenizer.get_vocab_size())


def write_tiny_model(shape: TinyShape, directory: Path) -> Path:
    """Writes config.json and the tokenizer into `directory` (created if absent)."""
    directory.mkdir(parents=True, exist_ok=True)
    vocab_size = train_tokenizer(directory)
    config = render_config(shape, vocab_size)
    (directory / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return directory


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("preset", choices=sorted(PRESETS))
    parser.add_argument("directory", type=Path)
    args = parser.parse_args()
    print(write_tiny_model(PRESETS[args.preset], args.directory))


if __name__ == "__main__":
    main()
