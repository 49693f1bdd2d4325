"""Model architecture facts: the numbers that decide weight and KV-cache size.

`architecture_from_hf_config` reads any Hugging Face `config.json` (as a dict); the
built-in catalog (`models.yaml`) is a set of such configs with a source per row, looked
up by catalog name or Hub id (`meta-llama/Meta-Llama-3-8B`, `hf://...`).
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any, Final, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from kvq.api.architecture import AttentionKind, LayerType, MlpKind, StateKind

# Families whose config.json may omit these keys; the Transformers class default applies.
_TIED_BY_DEFAULT = ("gemma",)
_QKV_BIAS_BY_DEFAULT = ("qwen2",)


class RecurrentState(BaseModel):
    """The fixed per-sequence state of Mamba / linear-attention layers (vLLM's MambaSpec).

    mamba1 (Jamba): conv (d_inner, kernel-1) + ssm (d_inner, d_state).
    mamba2 (Nemotron-H, Granite-4.0-H): conv (d_inner + 2 n_groups d_state, kernel-1) +
    ssm (heads, head_dim, d_state). gated_delta_net (Qwen3-Next, Qwen3.5): conv
    (2 k_heads k_dim + v_heads v_dim, kernel-1) + ssm (v_heads, v_dim, k_dim).
    Source: vllm/model_executor/layers/mamba/mamba_utils.py (MambaStateShapeCalculator), 0.26.0.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: StateKind
    conv_kernel: int = Field(gt=0)
    intermediate_size: int | None = Field(default=None, gt=0)
    state_size: int | None = Field(default=None, gt=0)
    n_groups: int = Field(default=1, gt=0)
    num_heads: int | None = Field(default=None, gt=0)
    head_dim: int | None = Field(default=None, gt=0)
    num_k_heads: int | None = Field(default=None, gt=0)
    num_v_heads: int | None = Field(default=None, gt=0)
    head_k_dim: int | None = Field(default=None, gt=0)
    head_v_dim: int | None = Field(default=None, gt=0)
    # The model's own default for the temporal (ssm) state when --mamba-ssm-cache-dtype is
    # auto: Nemotron-H float32, Qwen3.5 its config's mamba_ssm_dtype (models/config.py).
    ssm_dtype: str | None = None

    @model_validator(mode="after")
    def _complete(self) -> RecurrentState:
        needed = {
            "mamba1": ("intermediate_size", "state_size"),
            "mamba2": ("intermediate_size", "state_size", "num_heads", "head_dim"),
            "gated_delta_net": ("num_k_heads", "num_v_heads", "head_k_dim", "head_v_dim"),
        }[self.kind]
        missing = [name for name in needed if getattr(self, name) is None]
        if missing:
            raise ValueError(f"a {self.kind} state needs {', '.join(missing)}")
        return self


class ModelArchitecture(BaseModel):
    """Shape of a decoder-only transformer, enough for weight and KV arithmetic.

    GQA models store K and V per KV head (`num_kv_heads` x `head_dim`); MLA models
    (DeepSeek-V2/V3) store one compressed latent of `kv_lora_rank + rope_head_dim`
    per token and layer. Dense models have `num_experts == 1`.

    `layer_types` (one per layer, empty = every layer full attention, or sliding when only
    `sliding_window` is set) is what vLLM's KV-cache manager groups by: full, sliding
    (window `sliding_window`, or the layer's own in `layer_windows`), chunked local
    (`attention_chunk_size`), mamba / linear attention (a fixed `state` per sequence), or
    mlp (no cache). `layer_mlp` says which layers have a dense MLP, experts or none.
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
    sliding_window: int | None = Field(default=None, gt=0)
    layer_types: tuple[LayerType, ...] = ()
    layer_windows: tuple[int, ...] = ()
    attention_chunk_size: int | None = Field(default=None, gt=0)
    layer_mlp: tuple[MlpKind, ...] = ()
    # Weight matrices of a dense MLP: gate, up, down; Nemotron-H's relu2 MLP has no gate
    # (up, down: vLLM's NemotronHMLP).
    mlp_projections: int = Field(default=3, ge=2, le=3)
    state: RecurrentState | None = None
    # Hugging Face class (config.json "architectures"): decides vLLM's model runner.
    hf_architecture: str | None = None
    # The checkpoint's own quantization (config.json quantization_config.quant_method).
    weight_quantization: Literal["fp8", "mxfp4"] | None = None
    max_position_embeddings: int | None = None
    # The rotary cos/sin tables vLLM builds, one per distinct rotary embedding:
    # (positions, rotary_dim). They load with the model (see planner/weights.py).
    rope_tables: tuple[tuple[int, int], ...] = ()
    # Explicit parameter count; when set it wins over the count derived from the shape.
    num_params: int | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _consistent(self) -> ModelArchitecture:
        if self.attention == "mla" and (self.kv_lora_rank is None or self.rope_head_dim is None):
            raise ValueError("an MLA architecture needs kv_lora_rank and rope_head_dim")
        for name in ("layer_types", "layer_windows", "layer_mlp"):
            given = getattr(self, name)
            if given and len(given) != self.num_layers:
                raise ValueError(
                    f"{name} has {len(given)} entries for {self.num_layers} layers (one per layer)"
                )
        kinds = set(self.layer_types)
        if (
            "sliding_attention" in kinds
            and self.sliding_window is None
            and not any(self.layer_windows)
        ):
            raise ValueError("sliding_attention layers need sliding_window (or layer_windows)")
        if "chunked_attention" in kinds and self.attention_chunk_size is None:
            raise ValueError("chunked_attention layers need attention_chunk_size")
        if kinds & {"mamba", "linear_attention"} and self.state is None:
            raise ValueError("mamba / linear_attention layers need the recurrent state's shape")
        return self

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 1

    @property
    def layer_kinds(self) -> tuple[LayerType, ...]:
        """One type per layer; without layer_types every layer is full attention, or
        sliding when the model has one sliding window (vLLM's cache_config.sliding_window
        then applies to every layer: vllm/model_executor/layers/attention/attention.py)."""
        if self.layer_types:
            return self.layer_types
        kind: LayerType = "sliding_attention" if self.sliding_window else "full_attention"
        return (kind,) * self.num_layers

    @property
    def mlp_kinds(self) -> tuple[MlpKind, ...]:
        """One MLP kind per layer: given, or dense before first_k_dense_replace then MoE."""
        if self.layer_mlp:
            return self.layer_mlp
        dense_kind: MlpKind = "dense"
        moe_kind: MlpKind = "moe"
        if not self.is_moe:
            return (dense_kind,) * self.num_layers
        dense = min(self.first_k_dense_replace, self.num_layers)
        return (dense_kind,) * dense + (moe_kind,) * (self.num_layers - dense)

    @property
    def is_hybrid(self) -> bool:
        """vLLM's is_hybrid: attention mixed with Mamba / linear-attention state."""
        return any(k in ("mamba", "linear_attention") for k in self.layer_kinds)


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


# config.json layer-type names -> kvq's (Hugging Face layer_types, Granite-4.0-H, Qwen3-Next).
_LAYER_TYPE_NAMES: dict[str, LayerType] = {
    "full_attention": "full_attention",
    "attention": "full_attention",
    "sliding_attention": "sliding_attention",
    "chunked_attention": "chunked_attention",
    "linear_attention": "linear_attention",
    "mamba": "mamba",
}
# Nemotron-H's hybrid_override_pattern: one character per layer.
_NEMOTRON_H_PATTERN: dict[str, tuple[LayerType, MlpKind]] = {
    "M": ("mamba", "none"),
    "*": ("full_attention", "none"),
    "-": ("mlp", "dense"),
    "E": ("mlp", "moe"),
}


class UnknownLayerTypeError(ValueError):
    """A config names a layer kvq has no KV-cache model for; planning it as full attention
    would promise memory that does not exist (or hide memory that does)."""


def _layer_type(name: object, index: int) -> LayerType:
    found = _LAYER_TYPE_NAMES.get(str(name))
    if found is None:
        known = ", ".join(sorted(_LAYER_TYPE_NAMES))
        raise UnknownLayerTypeError(
            f"layer {index} has type {name!r}, which kvq cannot size (known: {known}); "
            "kvq refuses to plan it rather than count it as full attention"
        )
    return found


def _every(period: int, offset: int, layers: int) -> tuple[bool, ...]:
    return tuple(i % period == offset for i in range(layers))


def _layers_and_mlp(
    cfg: Mapping[str, Any], model_type: str, layers: int, num_experts: int
) -> tuple[tuple[LayerType, ...], tuple[MlpKind, ...]]:
    """Per-layer types and MLP kinds, as each family's config (and its Transformers
    class default) describes them. Empty tuples: uniform."""
    pattern = cfg.get("hybrid_override_pattern")
    if isinstance(pattern, str):
        if len(pattern) != layers:
            raise ValueError(
                f"hybrid_override_pattern has {len(pattern)} layers, num_hidden_layers {layers}"
            )
        unknown = sorted({c for c in pattern if c not in _NEMOTRON_H_PATTERN})
        if unknown:
            raise UnknownLayerTypeError(
                f"hybrid_override_pattern has layer symbols {unknown} kvq cannot size "
                "(known: M mamba, * attention, - MLP, E experts)"
            )
        pairs = [_NEMOTRON_H_PATTERN[c] for c in pattern]
        return tuple(t for t, _ in pairs), tuple(m for _, m in pairs)

    types: tuple[LayerType, ...] = ()
    raw = cfg.get("layer_types")
    if isinstance(raw, list) and raw:
        if len(raw) != layers:
            raise ValueError(f"layer_types has {len(raw)} entries, num_hidden_layers {layers}")
        types = tuple(_layer_type(name, i) for i, name in enumerate(raw))
    elif model_type.startswith("gemma3") and cfg.get("sliding_window"):
        # Transformers Gemma3TextConfig: every sliding_window_pattern-th layer is global.
        period = int(cfg.get("sliding_window_pattern") or 6)
        types = tuple(
            "full_attention" if (i + 1) % period == 0 else "sliding_attention"
            for i in range(layers)
        )
    elif model_type.startswith(("gemma2", "cohere2")) and cfg.get("sliding_window"):
        # Gemma2Config: even layers slide, odd layers are global.
        period = int(cfg.get("sliding_window_pattern") or 2)
        types = tuple(
            "full_attention" if (i + 1) % period == 0 else "sliding_attention"
            for i in range(layers)
        )
    elif model_type.startswith("llama4") and cfg.get("attention_chunk_size"):
        # Llama4TextConfig: no_rope_layers[i] == 0 marks a global (NoPE) layer; default
        # every no_rope_layer_interval-th (vllm/model_executor/models/llama4.py).
        nope = cfg.get("no_rope_layers") or [
            int((i + 1) % int(cfg.get("no_rope_layer_interval") or 4) != 0) for i in range(layers)
        ]
        types = tuple("full_attention" if int(flag) == 0 else "chunked_attention" for flag in nope)
    elif model_type.startswith("qwen3_next") or "linear_num_value_heads" in cfg:
        interval = int(cfg.get("full_attention_interval") or 4)
        types = tuple(
            "full_attention" if (i + 1) % interval == 0 else "linear_attention"
            for i in range(layers)
        )
    elif model_type.startswith("jamba"):
        attn = _every(
            int(cfg.get("attn_layer_period") or 8), int(cfg.get("attn_layer_offset") or 4), layers
        )
        types = tuple("full_attention" if a else "mamba" for a in attn)

    mlp: tuple[MlpKind, ...] = ()
    if num_experts > 1 and model_type.startswith("jamba"):
        moe = _every(
            int(cfg.get("expert_layer_period") or 2),
            int(cfg.get("expert_layer_offset") or 1),
            layers,
        )
        mlp = tuple("moe" if m else "dense" for m in moe)
    elif num_experts > 1 and cfg.get("interleave_moe_layer_step"):
        step = int(cfg["interleave_moe_layer_step"])
        mlp = tuple("moe" if (i + 1) % step == 0 else "dense" for i in range(layers))
    elif num_experts > 1 and isinstance(cfg.get("mlp_only_layers"), list):
        dense_layers = {int(i) for i in cfg["mlp_only_layers"]}
        if dense_layers:
            mlp = tuple("dense" if i in dense_layers else "moe" for i in range(layers))
    return types, mlp


def _recurrent_state(cfg: Mapping[str, Any], model_type: str, hidden: int) -> RecurrentState | None:
    """The Mamba / gated-delta-net state shape, with the config keys each vLLM model reads
    (get_mamba_state_shape_from_config in qwen3_next.py, nemotron_h.py, granitemoehybrid.py,
    jamba.py, vLLM 0.26.0)."""
    if "linear_num_value_heads" in cfg:
        return RecurrentState(
            kind="gated_delta_net",
            conv_kernel=int(cfg.get("linear_conv_kernel_dim") or 4),
            num_k_heads=int(cfg["linear_num_key_heads"]),
            num_v_heads=int(cfg["linear_num_value_heads"]),
            head_k_dim=int(cfg["linear_key_head_dim"]),
            head_v_dim=int(cfg["linear_value_head_dim"]),
            ssm_dtype=cfg.get("mamba_ssm_dtype"),
        )
    if "hybrid_override_pattern" in cfg or model_type.startswith("nemotron_h"):
        heads, head_dim = int(cfg["mamba_num_heads"]), int(cfg["mamba_head_dim"])
        return RecurrentState(
            kind="mamba2",
            conv_kernel=int(cfg.get("conv_kernel") or 4),
            intermediate_size=heads * head_dim,
            state_size=int(cfg["ssm_state_size"]),
            n_groups=int(cfg.get("n_groups") or 1),
            num_heads=heads,
            head_dim=head_dim,
            # NemotronHForCausalLMConfig: float32 unless the config says otherwise.
            ssm_dtype=str(cfg.get("mamba_ssm_cache_dtype") or "float32"),
        )
    if "mamba_n_heads" in cfg:  # Granite-4.0-H (granitemoehybrid), Bamba-style mamba2
        return RecurrentState(
            kind="mamba2",
            conv_kernel=int(cfg.get("mamba_d_conv") or 4),
            intermediate_size=int(cfg.get("mamba_expand") or 2) * hidden,
            state_size=int(cfg["mamba_d_state"]),
            n_groups=int(cfg.get("mamba_n_groups") or 1),
            num_heads=int(cfg["mamba_n_heads"]),
            head_dim=int(cfg["mamba_d_head"]),
        )
    if model_type.startswith("jamba") or "mamba_d_state" in cfg:
        return RecurrentState(
            kind="mamba1",
            conv_kernel=int(cfg.get("mamba_d_conv") or 4),
            intermediate_size=int(cfg.get("mamba_expand") or 2) * hidden,
            state_size=int(cfg.get("mamba_d_state") or 16),
        )
    return None


# What the Transformers config class assumes for keys a config.json leaves out (the
# published Gemma-3 4B/12B/27B text_config omits heads, head size and vocabulary): the
# class defaults of transformers 5.19.0 (CONFIG_MAPPING[model_type]()), for the keys kvq
# reads. Only absent keys are filled; a key the file sets to null stays null. Expert counts
# of Nemotron-H and Granite-4.0-H are left out: their dense models omit them.
_FAMILY_DEFAULTS: dict[str, dict[str, Any]] = {
    "gemma3_text": {
        "vocab_size": 262208, "hidden_size": 2304, "intermediate_size": 9216,
        "num_hidden_layers": 26, "num_attention_heads": 8, "num_key_value_heads": 4,
        "head_dim": 256, "sliding_window": 4096, "max_position_embeddings": 131072,
        "tie_word_embeddings": True, "attention_bias": False,
    },
    "gemma2": {
        "vocab_size": 256000, "num_attention_heads": 8, "num_key_value_heads": 4,
        "head_dim": 256, "sliding_window": 4096, "max_position_embeddings": 8192,
        "tie_word_embeddings": True,
    },
    "qwen3_next": {
        "vocab_size": 151936, "num_attention_heads": 16, "num_key_value_heads": 2,
        "head_dim": 256, "num_experts": 512, "num_experts_per_tok": 10,
        "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512,
        "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
        "linear_num_key_heads": 16, "linear_num_value_heads": 32,
    },
    "qwen3_moe": {"num_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 768},
    "gpt_oss": {"head_dim": 64, "sliding_window": 128, "attention_bias": True},
    "llama4_text": {
        "head_dim": 128, "attention_chunk_size": 8192, "no_rope_layer_interval": 4,
        "interleave_moe_layer_step": 1, "intermediate_size_mlp": 16384,
        "num_local_experts": 16, "num_experts_per_tok": 1,
    },
    "nemotron_h": {
        "head_dim": 128, "mamba_num_heads": 128, "mamba_head_dim": 64, "n_groups": 8,
        "ssm_state_size": 128, "conv_kernel": 4,
    },
    "granitemoehybrid": {
        "mamba_expand": 2, "mamba_n_groups": 1, "mamba_n_heads": 128, "mamba_d_head": 64,
        "mamba_d_state": 256, "mamba_d_conv": 4, "shared_intermediate_size": 1024,
    },
    "jamba": {
        "num_experts": 16, "num_experts_per_tok": 2, "mamba_expand": 2, "mamba_d_state": 16,
        "mamba_d_conv": 4, "attn_layer_period": 8, "attn_layer_offset": 4,
        "expert_layer_period": 2, "expert_layer_offset": 1,
    },
}  # fmt: skip


def architecture_from_hf_config(config: Mapping[str, Any]) -> ModelArchitecture:
    """Read a Hugging Face `config.json` (already parsed) into a `ModelArchitecture`.

    Layer types come from `layer_types` or the family's own keys (Gemma's
    sliding_window_pattern, Llama-4's no_rope_layers, Qwen3-Next's full_attention_interval,
    Nemotron-H's hybrid_override_pattern, Jamba's attn_layer_period); a layer type kvq has
    no model for raises UnknownLayerTypeError.
    """
    cfg = _text_config(config)
    model_type = str(cfg.get("model_type") or "").lower()
    cfg = {**_FAMILY_DEFAULTS.get(model_type, {}), **cfg}

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
    intermediate = int(
        _first(cfg, "intermediate_size_mlp", "intermediate_size", "ffn_dim", "n_inner")
        or 4 * int(hidden)
    )
    moe_intermediate = cfg.get("moe_intermediate_size")
    if num_experts > 1 and moe_intermediate is None:
        moe_intermediate = cfg.get("intermediate_size") or intermediate
    shared_size = cfg.get("shared_expert_intermediate_size")
    if model_type.startswith("granitemoehybrid"):
        # Granite-4.0-H: every layer's shared_mlp (gated, shared_intermediate_size wide) sits
        # beside its experts; with no experts it is the layer's only MLP (vLLM 0.26
        # granitemoehybrid.py, GraniteMoeHybrid*DecoderLayer).
        shared_size = cfg.get("shared_intermediate_size") or None
        if num_experts == 1 and shared_size:
            intermediate, shared_size = int(shared_size), None
    num_shared = int(cfg.get("n_shared_experts") or (1 if shared_size else 0))
    if model_type.startswith("llama4") and num_experts > 1:
        num_shared = 1  # Llama-4: one shared expert of the routed width per MoE layer

    tie = cfg.get("tie_word_embeddings")
    if tie is None:
        tie = model_type.startswith(_TIED_BY_DEFAULT)
    qkv_bias = cfg.get("attention_bias")
    if qkv_bias is None:
        qkv_bias = model_type.startswith(_QKV_BIAS_BY_DEFAULT)
    sliding = cfg.get("sliding_window") if cfg.get("use_sliding_window", True) else None
    layer_types, layer_mlp = _layers_and_mlp(cfg, model_type, int(layers), num_experts)
    if layer_types and "sliding_attention" not in layer_types:
        sliding = None  # a window no layer uses (vLLM reads it per sliding layer only)
    chunk = cfg.get("attention_chunk_size") if "chunked_attention" in layer_types else None
    archs = config.get("architectures") or cfg.get("architectures")
    quant = config.get("quantization_config") or cfg.get("quantization_config") or {}
    quant_method = str(quant.get("quant_method") or "") if isinstance(quant, Mapping) else ""

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
        num_experts_per_tok=int(
            _first(cfg, "num_experts_per_tok", "num_experts_per_token", "moe_topk") or 1
        ),
        moe_intermediate_size=None if moe_intermediate is None else int(moe_intermediate),
        num_shared_experts=num_shared,
        shared_expert_intermediate_size=None if shared_size is None else int(shared_size),
        first_k_dense_replace=int(cfg.get("first_k_dense_replace") or 0),
        sliding_window=None if not sliding else int(sliding),
        layer_types=layer_types,
        attention_chunk_size=None if chunk is None else int(chunk),
        layer_mlp=layer_mlp,
        mlp_projections=2 if cfg.get("mlp_hidden_act") == "relu2" else 3,
        state=_recurrent_state(cfg, model_type, int(hidden)),
        hf_architecture=str(archs[0]) if isinstance(archs, list) and archs else None,
        weight_quantization=quant_method if quant_method in ("fp8", "mxfp4") else None,
        max_position_embeddings=_first(cfg, "max_position_embeddings", "n_positions"),
        rope_tables=_rope_tables(cfg, model_type, head_dim, rope_dim, layer_types),
    )


# Families whose attention layers use no rotary embedding (vLLM builds no table).
_NO_ROPE_TYPES: Final = ("jamba", "mamba", "falcon_mamba", "nemotron_h", "gpt2", "bloom", "mpt")


def _rope_tables(
    cfg: Mapping[str, Any],
    model_type: str,
    head_dim: int,
    mla_rope_dim: Any,
    layer_types: tuple[str, ...],
) -> tuple[tuple[int, int], ...]:
    """The cos/sin caches vLLM 0.26 registers (layers/rotary_embedding: `get_rope` keeps
    one per distinct parameter set, `RotaryEmbedding.__init__` registers
    `cos_sin_cache` of (positions, rotary_dim) in the model dtype). Positions: the
    model's max_position_embeddings; x factor for `linear` (LinearScalingRotaryEmbedding);
    original_max_position_embeddings x factor for `yarn` and DeepSeek's yarn
    (YaRN/DeepseekScalingRotaryEmbedding); `llama3` and `default` keep max_position."""
    max_pos = _first(cfg, "max_position_embeddings", "n_positions")
    if not max_pos or model_type.startswith(_NO_ROPE_TYPES):
        return ()
    if model_type.startswith("granitemoehybrid") and cfg.get("position_embedding_type") != "rope":
        return ()  # Granite-4.0-H's attention is NoPE unless the config asks for rope
    if "chunked_attention" not in layer_types and model_type.startswith("llama4"):
        return ()  # every layer NoPE
    params = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    if isinstance(params, Mapping) and "full_attention" in params:
        params = params["full_attention"]  # transformers v5: per layer type
    params = params if isinstance(params, Mapping) else {}
    kind = str(params.get("rope_type") or params.get("type") or "default")
    factor = float(params.get("factor") or 1.0)
    positions = int(max_pos)
    if kind == "linear":
        positions = int(max_pos * factor)
    elif kind in ("yarn", "deepseek_yarn"):
        positions = int(int(params.get("original_max_position_embeddings") or max_pos) * factor)
    if mla_rope_dim is not None and cfg.get("kv_lora_rank") is not None:
        rotary = int(mla_rope_dim)
    else:
        fraction = float(cfg.get("partial_rotary_factor") or cfg.get("rotary_pct") or 1.0)
        rotary = int(cfg.get("rotary_dim") or head_dim * fraction)
    tables = [(positions, rotary)]
    if model_type.startswith("gemma3") and "sliding_attention" in layer_types:
        # Gemma-3's local layers: a default rope of their own base (models/gemma3.py).
        tables.append((int(max_pos), head_dim))
    return tuple(tables)  # distinct bases: separate tables even when the shapes match


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
