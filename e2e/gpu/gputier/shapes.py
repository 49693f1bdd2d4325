"""Model directories for dummy weights: a config.json from kvq's model catalog, nothing else.

vLLM with `--load-format dummy` builds the model from config.json and fills the weights
with random values; with `--skip-tokenizer-init` it needs no tokenizer either (prompts are
token ids). The shapes come from kvq's own catalog (operator/kvq/catalog/models.yaml), so
the planner and the engine see the same numbers; each row names its model class
(`architectures`) and every key vLLM reads to build it (tests/engine/test_catalog_configs.py).
"""

from __future__ import annotations

import copy
import json
import math
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

# The Llama-3-8B shape first: the source document's check runs on it.
DEFAULT_SHAPES = ("llama-3-8b", "qwen2.5-7b", "phi-3-mini-4k")
# One entry per layer (truncated with the model), and lists of layer indices (filtered).
_PER_LAYER_LISTS = ("layer_types", "no_rope_layers")
_LAYER_INDEX_LISTS = ("moe_layers", "mlp_only_layers")
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


def catalog_config(shape: str) -> dict[str, Any]:
    """The catalog row's config.json keys, with the tier's defaults under them."""
    try:
        config = catalog_configs()[shape]
    except KeyError:
        known = ", ".join(sorted(catalog_configs()))
        raise ValueError(f"unknown shape {shape!r} (kvq's catalog has: {known})") from None
    # The row's nulls stay: a config class's default can differ from the published null
    # (DeepseekV2Config's q_lora_rank is 1536; DeepSeek-V2-Lite's is null).
    return {**_DEFAULTS, **copy.deepcopy(config)}


def config_json(shape: str, layers: int | None = None) -> dict[str, Any]:
    """A config.json vLLM can build `shape` from (with `layers`, fewer layers of it)."""
    return tier_config(shape, layers)[0]


def tier_config(shape: str, layers: int | None = None) -> tuple[dict[str, Any], list[str]]:
    """The config.json the tier serves for `shape`, and what it changed from the row.

    Weights are dummy bf16, so a published quantization (gpt-oss's MXFP4 experts,
    DeepSeek-V3's FP8 blocks) is dropped: the engine and `kvq plan` both see bf16 weights.
    With `layers`, the model keeps its first `layers` layers; every per-layer key follows
    and the layer pattern must repeat whole (see `shrink`).
    """
    config = catalog_config(shape)
    changes = []
    if config.pop("quantization_config", None) is not None:
        changes.append("quantization_config dropped: dummy bf16 weights")
    if layers is not None:
        changes.append(shrink(config, layers))
    return config, changes


def layer_period(config: dict[str, Any]) -> int:
    """Layers after which the model's layer pattern repeats (attention kinds, RoPE, MoE)."""
    periods = [1]
    for key in (
        "sliding_window_pattern",
        "full_attention_interval",
        "interleave_moe_layer_step",
        "decoder_sparse_step",
        "attn_layer_period",  # Jamba: attention, and experts, once every N layers
        "expert_layer_period",
    ):
        if isinstance(config.get(key), int) and config[key] > 0:
            periods.append(config[key])
    for key in _PER_LAYER_LISTS:
        if isinstance(config.get(key), list) and config[key]:
            periods.append(_smallest_period(config[key]))
    if str(config.get("model_type")) == "gemma2":
        periods.append(2)  # Gemma-2 alternates sliding and global layers (its config says so)
    return math.lcm(*periods)


def shrink(config: dict[str, Any], layers: int) -> str:
    """Cut `config` (in place) to its first `layers` layers; returns what it did.

    Refused (ValueError) where the cut would change what kinds of layers the model has or
    their ratio: `layers` must be a multiple of the pattern's period, and a DeepSeek model
    keeps at least one MoE layer after its dense ones. Expert counts stay.
    """
    total = int(config["num_hidden_layers"])
    if not 0 < layers < total:
        raise ValueError(f"--layers {layers}: the model has {total} layers; give 1..{total - 1}")
    period = layer_period(config)
    dense_first = int(config.get("first_k_dense_replace") or 0)
    if layers % period:
        raise ValueError(
            f"--layers {layers}: the layer pattern repeats every {period} layers; "
            f"give a multiple of {period} to keep the same pattern"
        )
    if dense_first and layers <= dense_first:
        raise ValueError(
            f"--layers {layers}: the first {dense_first} layers are dense; give more to keep "
            "MoE layers"
        )
    config["num_hidden_layers"] = layers
    for key in _PER_LAYER_LISTS:
        if isinstance(config.get(key), list):
            config[key] = config[key][:layers]
    for key in _LAYER_INDEX_LISTS:
        if isinstance(config.get(key), list):
            config[key] = [i for i in config[key] if i < layers]
    if isinstance(config.get("max_window_layers"), int):
        config["max_window_layers"] = min(config["max_window_layers"], layers)
    return f"{layers} of {total} layers (the same layer pattern, every {period})"


def _smallest_period(values: list[Any]) -> int:
    return next(
        p
        for p in range(1, len(values) + 1)
        if all(v == values[i % p] for i, v in enumerate(values))
    )


def write_model_dir(shape: str, directory: Path, layers: int | None = None) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    text = json.dumps(config_json(shape, layers), indent=2) + "\n"
    (directory / "config.json").write_text(text)
    return directory
