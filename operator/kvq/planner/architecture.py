"""Which architecture to plan with: the spec's facts, kvq's catalog, or a config.json."""

from __future__ import annotations

import json
from pathlib import Path

from kvq.api.architecture import ArchitectureSpec
from kvq.api.model import ModelSpec
from kvq.catalog.models import (
    ModelArchitecture,
    ModelCatalog,
    RecurrentState,
    architecture_from_hf_config,
)


class UnknownModelError(LookupError):
    """kvq has no architecture facts for the model; the message says how to give them."""


def architecture_from_spec(spec: ArchitectureSpec) -> ModelArchitecture:
    """The planner's view of `spec.model.architecture`.

    Query heads default to the KV heads and the width to heads x headDim; with only
    numParams given, the MLP and vocabulary widths are placeholders that affect the
    activation estimate, not the weights (numParams decides those).
    """
    kv_heads = spec.num_kv_heads or 1
    heads = spec.num_attention_heads or kv_heads
    head_dim = spec.head_dim or (spec.kv_lora_rank or 64)
    hidden = spec.hidden_size or heads * head_dim
    state = spec.state
    experts = spec.num_experts or 1
    return ModelArchitecture(
        num_layers=spec.num_layers,
        num_attention_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        hidden_size=hidden,
        intermediate_size=spec.intermediate_size or 4 * hidden,
        vocab_size=spec.vocab_size or 32_000,
        attention=spec.attention,
        kv_lora_rank=spec.kv_lora_rank,
        rope_head_dim=spec.rope_head_dim,
        num_params=spec.num_params,
        sliding_window=spec.sliding_window,
        layer_types=tuple(spec.layer_types or ()),
        layer_windows=tuple(spec.layer_windows or ()),
        attention_chunk_size=spec.attention_chunk_size,
        num_experts=experts,
        num_experts_per_tok=spec.num_experts_per_tok or 1,
        moe_intermediate_size=spec.moe_intermediate_size,
        num_shared_experts=spec.num_shared_experts or 0,
        shared_expert_intermediate_size=spec.shared_expert_intermediate_size,
        state=None
        if state is None
        else RecurrentState(
            kind=state.kind,
            conv_kernel=state.conv_kernel,
            intermediate_size=state.intermediate_size,
            state_size=state.state_size,
            n_groups=state.n_groups,
            num_heads=state.num_heads,
            head_dim=state.head_dim,
            num_k_heads=state.num_k_heads,
            num_v_heads=state.num_v_heads,
            head_k_dim=state.head_k_dim,
            head_v_dim=state.head_v_dim,
            ssm_dtype=state.ssm_dtype,
        ),
        hf_architecture=spec.model_class,
    )


def resolve_architecture(model: ModelSpec, catalog: ModelCatalog) -> ModelArchitecture:
    """Spec facts win; otherwise the catalog by URI (hf:// ids and their aliases)."""
    if model.architecture is not None:
        return architecture_from_spec(model.architecture)
    found = catalog.lookup(model.uri)
    if found is None:
        raise UnknownModelError(
            f"kvq's catalog does not know {model.uri}: give spec.model.architecture "
            "(numLayers, numKvHeads, headDim, hiddenSize, intermediateSize, vocabSize from its "
            "config.json)"
        )
    return found.architecture


def architecture_for_cli(model: str, catalog: ModelCatalog) -> tuple[str, ModelArchitecture]:
    """`kvq plan --model`: a catalog name, an hf:// URI or Hub id, or a config.json path."""
    path = Path(model)
    if path.suffix == ".json" or path.is_file():
        if not path.is_file():
            raise UnknownModelError(f"no such config.json: {model}")
        return path.name, architecture_from_hf_config(json.loads(path.read_text()))
    if path.is_dir() and (path / "config.json").is_file():
        config = json.loads((path / "config.json").read_text())
        return path.name, architecture_from_hf_config(config)
    found = catalog.lookup(model)
    if found is None:
        raise UnknownModelError(
            f"unknown model {model!r}: use a catalog name (kvq plan --list-models), "
            "an hf:// URI of a catalog model, or a path to a config.json"
        )
    return found.name, found.architecture
