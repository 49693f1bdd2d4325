"""Model directories for dummy weights: a config.json from kvq's model catalog, nothing else.

vLLM with `--load-format dummy` builds the model from config.json and fills the weights
with random values; with `--skip-tokenizer-init` it needs no tokenizer either (prompts are
token ids). The shapes come from kvq's own catalog (operator/kvq/catalog/models.yaml), so
the planner and the engine see the same numbers.
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

# The Llama-3-8B shape first: the source document's check runs on it.
DEFAULT_SHAPES = ("llama-3-8b", "qwen2.5-7b", "phi-3-mini-4k")
# vLLM picks the model class from `architectures`; the catalog keeps only model_type.
ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "phi3": "Phi3ForCausalLM",
    "gemma2": "Gemma2ForCausalLM",
    "mixtral": "MixtralForCausalLM",
    "deepseek_v2": "DeepseekV2ForCausalLM",
}
# Keys config classes read that the catalog does not keep (no effect on memory).
_DEFAULTS: dict[str, Any] = {
    "torch_dtype": "bfloat16",
    "rms_norm_eps": 1e-5,
    "hidden_act": "silu",
    "bos_token_id": 1,
    "eos_token_id": 2,
}


@cache
def catalog_configs() -> dict[str, dict[str, Any]]:
    """Catalog name -> the config.json subset the catalog keeps."""
    text = resources.files("kvq.catalog").joinpath("models.yaml").read_text(encoding="utf-8")
    return {row["name"]: dict(row["config"]) for row in yaml.safe_load(text)["models"]}


def config_json(shape: str) -> dict[str, Any]:
    """A config.json vLLM can build `shape` from."""
    try:
        config = catalog_configs()[shape]
    except KeyError:
        known = ", ".join(sorted(catalog_configs()))
        raise ValueError(f"unknown shape {shape!r} (kvq's catalog has: {known})") from None
    model_type = str(config["model_type"])
    document = {**_DEFAULTS, **config, "architectures": [ARCHITECTURES[model_type]]}
    return {k: v for k, v in document.items() if v is not None}


def write_model_dir(shape: str, directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config_json(shape), indent=2) + "\n")
    return directory
