"""Model architecture facts: the numbers that decide weight and KV-cache size.

`architecture_from_hf_config` reads any Hugging Face `config.json` (as a dict); the
built-in catalog (`models.yaml`) is a set of such configs with a source per row, looked
up by catalog name or Hub id (`meta-llama/Meta-Llama-3-8B`, `hf://...`).
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from kvq.api.architecture import AttentionKind

# Families whose config.json may omit these keys; the Transformers class default applies.
_TIED_BY_DEFAULT = ("gemma",)
_QKV_BIAS_BY_DEFAULT = ("qwen2",)


class ModelArchitecture(BaseModel):
    """Shape of a decoder-only transformer, enough for weight and KV arithmetic.

    GQA models store K and V per KV head (`num_kv_heads` x `head_dim`); MLA models
    (DeepSeek-V2/V3) store one compressed latent of `kv_lora_rank + rope_head_dim`
    per token and layer. Dense models have `num_experts == 1`.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    num_layers: int = Field(gt=0)
    num_attention_heads: int = Field(gt=0)
    num_kv_heads: int = Field(gt=0)
    head_dim: int = Field(gt=0)
    hidden_size: int = Field(gt=0)
    intermediate_size: int = Field(gt=0)
    vocab_size: int = Field(gt=0)
    attention: AttentionKind = "gqa"
    # MLA (DeepSeek): latent rank, decoupled RoPE key width, query low-rank, head widths.
    kv_lora_rank: int | None = None
    rope_head_dim: int | None = None
    q_lora_rank: int | None = None
    qk_nope_head_dim: int | None = None
    v_head_dim: int | None = None
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    # Mixture of experts: routed experts, experts per token, expert width, shared experts.
    num_experts: int = Field(default=1, gt=0)
    num_experts_per_tok: int = Field(default=1, gt=0)
    moe_intermediate_size: int | None = None
    num_shared_experts: int = Field(default=0, ge=0)
    shared_expert_intermediate_size: int | None = None
    first_k_dense_replace: int = Field(default=0, ge=0)
    sliding_window: int | None = None
    max_position_embeddings: int | None = None
    # Explicit parameter count; when set it wins over the count derived from the shape.
    num_params: int | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _mla_has_latent(self) -> ModelArchitecture:
        if self.attention == "mla" and (self.kv_lora_rank is None or self.rope_head_dim is None):
            raise ValueError("an MLA architecture needs kv_lora_rank and rope_head_dim")
        return self

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 1


class CatalogModel(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    hf_id: str
    aliases: tuple[str, ...] = ()
    architecture: ModelArchitecture
    source: str


def _first(config: Mapping[str, Any], *keys: str) -> Any:
    for key in keys:
        value = config.get(key)
        if value is not None:
            return value
    return None


def _text_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """Multimodal configs (Llava, Gemma-3, Mistral-3) nest the language model's facts."""
    nested = config.get("text_config")
    if isinstance(nested, Mapping) and "num_hidden_layers" not in config:
        merged = dict(nested)
        for key in ("tie_word_embeddings", "model_type"):
            if key not in merged and key in config:
                merged[key] = config[key]
        return merged
    return dict(config)


def architecture_from_hf_config(config: Mapping[str, Any]) -> ModelArchitecture:
    """Read a Hugging Face `config.json` (already parsed) into a `ModelArchitecture`."""
    cfg = _text_config(config)
    model_type = str(cfg.get("model_type") or "").lower()

    layers = _first(cfg, "num_hidden_layers", "n_layer", "num_layers")
    hidden = _first(cfg, "hidden_size", "n_embd", "d_model")
    heads = _first(cfg, "num_attention_heads", "n_head")
    vocab = _first(cfg, "vocab_size")
    missing = [
        k
        for k, v in {
            "num_hidden_layers": layers,
            "hidden_size": hidden,
            "num_attention_heads": heads,
            "vocab_size": vocab,
        }.items()
        if v is None
    ]
    if missing:
        raise ValueError(f"config.json lacks {', '.join(missing)}")

    kv_lora_rank = cfg.get("kv_lora_rank")
    attention: AttentionKind = "mla" if kv_lora_rank is not None else "gqa"
    qk_nope = cfg.get("qk_nope_head_dim")
    rope_dim = cfg.get("qk_rope_head_dim")
    if attention == "mla" and qk_nope is not None and rope_dim is not None:
        head_dim = int(qk_nope) + int(rope_dim)
    else:
        head_dim = int(_first(cfg, "head_dim") or int(hidden) // int(heads))

    num_experts = int(_first(cfg, "num_local_experts", "n_routed_experts", "num_experts") or 1)
    intermediate = int(_first(cfg, "intermediate_size", "ffn_dim", "n_inner") or 4 * int(hidden))
    moe_intermediate = cfg.get("moe_intermediate_size")
    if num_experts > 1 and moe_intermediate is None:
        moe_intermediate = intermediate
    shared_size = cfg.get("shared_expert_intermediate_size")
    num_shared = int(cfg.get("n_shared_experts") or (1 if shared_size else 0))

    tie = cfg.get("tie_word_embeddings")
    if tie is None:
        tie = model_type.startswith(_TIED_BY_DEFAULT)
    qkv_bias = cfg.get("attention_bias")
    if qkv_bias is None:
        qkv_bias = model_type.startswith(_QKV_BIAS_BY_DEFAULT)
    sliding = cfg.get("sliding_window") if cfg.get("use_sliding_window", True) else None

    return ModelArchitecture(
        num_layers=int(layers),
        num_attention_heads=int(heads),
        num_kv_heads=int(_first(cfg, "num_key_value_heads", "num_kv_heads", "num_attention_heads")),
        head_dim=head_dim,
        hidden_size=int(hidden),
        intermediate_size=intermediate,
        vocab_size=int(vocab),
        attention=attention,
        kv_lora_rank=None if kv_lora_rank is None else int(kv_lora_rank),
        rope_head_dim=None if rope_dim is None or attention != "mla" else int(rope_dim),
        q_lora_rank=cfg.get("q_lora_rank"),
        qk_nope_head_dim=None if qk_nope is None else int(qk_nope),
        v_head_dim=cfg.get("v_head_dim"),
        tie_word_embeddings=bool(tie),
        qkv_bias=bool(qkv_bias),
        num_experts=num_experts,
        num_experts_per_tok=int(cfg.get("num_experts_per_tok") or 1),
        moe_intermediate_size=None if moe_intermediate is None else int(moe_intermediate),
        num_shared_experts=num_shared,
        shared_expert_intermediate_size=None if shared_size is None else int(shared_size),
        first_k_dense_replace=int(cfg.get("first_k_dense_replace") or 0),
        sliding_window=None if sliding is None else int(sliding),
        max_position_embeddings=_first(cfg, "max_position_embeddings", "n_positions"),
    )


def _key(name: str) -> str:
    key = name.strip().lower()
    key = key.removeprefix("hf://")
    key = key.split("@", 1)[0]  # hf://org/name@revision
    return key.strip("/")


class ModelCatalog:
    """Built-in models by catalog name, Hub id, alias or Hub id without the org."""

    def __init__(self, models: list[CatalogModel]) -> None:
        self._models = list(models)
        self._index: dict[str, CatalogModel] = {}
        for model in self._models:
            for name in (model.name, model.hf_id, *model.aliases):
                self._index.setdefault(_key(name), model)
                self._index.setdefault(_key(name).rsplit("/", 1)[-1], model)

    def all(self) -> list[CatalogModel]:
        return list(self._models)

    def lookup(self, name_or_uri: str) -> CatalogModel | None:
        return self._index.get(_key(name_or_uri))


def load_model_catalog(path: Path | None = None) -> ModelCatalog:
    """Read the model catalog: the packaged `models.yaml` unless `path` names another file."""
    if path is None:
        text = resources.files("kvq.catalog").joinpath("models.yaml").read_text(encoding="utf-8")
    else:
        text = path.read_text(encoding="utf-8")
    data: dict[str, Any] = yaml.safe_load(text)
    return ModelCatalog(
        [
            CatalogModel(
                name=row["name"],
                hf_id=row["hf_id"],
                aliases=tuple(row.get("aliases") or ()),
                architecture=architecture_from_hf_config(row["config"]),
                source=row["source"],
            )
            for row in data["models"]
        ]
    )
