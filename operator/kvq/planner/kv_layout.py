"""How vLLM's KV-cache manager lays a model's layers out: one spec per layer, layers grouped
by spec, one page size for all, padding layers, and what one request needs.

Source, vLLM 0.26.0 (each step names its function):
- per-layer specs: `Attention.get_kv_cache_spec` (layers/attention/attention.py),
  `ChunkedLocalAttention.get_kv_cache_spec`, `MambaBase.get_kv_cache_spec`;
- block sizes: `Platform.update_block_size_for_backend` (platforms/interface.py): the
  backend's block (16 for FlashAttention), raised for Mamba hybrids until an attention page
  holds one state (`_align_hybrid_block_size`, the state padded to that page) and for
  `--kv-cache-dtype-skip-layers` (`_align_heterogeneous_kv_block_size`);
- `get_kv_cache_groups` (v1/core/kv_cache_utils.py): `--disable-hybrid-kv-cache-manager`
  turns sliding and chunked layers into full ones (`unify_hybrid_kv_cache_specs`, refused
  with Mamba layers); one group when every layer has the same spec; otherwise
  `unify_kv_cache_spec_page_size` (smaller pages scale their block size, Mamba pads) and
  `_get_kv_cache_groups_uniform_page_size` (group size = the fewest layers of one spec, or
  the most when no type has 1.5x the fewest; "Add N padding layers, may waste at most X%");
- per-request pages: `max_memory_usage_bytes` of each spec (v1/kv_cache_interface.py):
  full cdiv(L, block); sliding cdiv(min(window - 1 + in-flight, L), block) + 1; chunked
  cdiv(min(chunk + in-flight, L), block); Mamba one state (mamba_cache_mode "none", the
  default while prefix caching is off for hybrids: engine/arg_utils.py);
- `get_kv_cache_config_from_groups`: blocks = available // (page x group size);
  `get_max_concurrency_for_kv_cache_config`: concurrency = blocks / pages per request;
  `get_kv_cache_capacity`: "GPU KV cache size" = int(concurrency x max_model_len).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Final, Literal

from kvq.catalog.models import ModelArchitecture, RecurrentState
from kvq.planner.kv import kv_heads_per_gpu, layer_token_bytes

SpecKind = Literal["full", "sliding", "chunked", "state"]

_KERNEL_BLOCK: Final = 16  # FlashAttention / Triton: MultipleOf(16)
# vLLM's state dtypes: mamba_cache_dtype / mamba_ssm_cache_dtype names -> bytes.
_STATE_DTYPE_BYTES: Final = {"auto": 2, "bfloat16": 2, "float16": 2, "float32": 4}
_SLIDING_SKIP: Final = "sliding_window"


class KvLayoutError(ValueError):
    """vLLM would refuse this layout at start-up; the message says why and how to fix it."""


@dataclass(frozen=True)
class LayerSpec:
    """One layer's KV-cache spec, as vLLM compares specs to group layers."""

    kind: SpecKind
    block_size: int
    page_bytes: int
    window: int = 0  # sliding window or attention chunk
    dtype: str = "auto"


@dataclass(frozen=True)
class KvGroup:
    spec: LayerSpec
    layers: int  # real layers; the rest of the group is padding


@dataclass(frozen=True)
class KvLayout:
    groups: tuple[KvGroup, ...]
    group_size: int
    page_bytes: int
    padding_warnings: tuple[str, ...]
    hybrid_manager: bool

    @property
    def block_bytes(self) -> int:
        """Bytes one block id costs: one page in each of `group_size` shared tensors."""
        return self.page_bytes * self.group_size

    @property
    def padding_layers(self) -> int:
        return sum(self.group_size - g.layers for g in self.groups)

    @property
    def attention_block_size(self) -> int:
        sizes = [g.spec.block_size for g in self.groups if g.spec.kind != "state"]
        return min(sizes) if sizes else 0

    def pages_per_request(self, max_model_len: int, max_in_flight_tokens: int) -> int:
        return sum(_pages(g.spec, max_model_len, max_in_flight_tokens) for g in self.groups)

    def describe(self) -> str:
        """The groups in one line: '1 x 4 full + 6 x 4 sliding 512 (pages of 16,384 B)'."""
        counts = Counter((g.spec.kind, g.spec.window, g.spec.dtype) for g in self.groups)
        dtypes = Counter(g.spec.dtype for g in self.groups if g.spec.kind != "state")
        primary = dtypes.most_common(1)[0][0] if dtypes else ""
        parts = []
        for (kind, window, dtype), n in counts.items():
            label = kind if not window else f"{kind} {window}"
            if kind != "state" and dtype != primary:
                label += f" ({dtype})"
            parts.append(f"{n} x {self.group_size} {label}")
        return f"{' + '.join(parts)} layers (pages of {self.page_bytes:,} B)"


@dataclass(frozen=True)
class KvManagerFlags:
    hybrid_manager: bool = True
    skip_layers: tuple[str, ...] = ()


def kv_manager_flags(extra_args: Sequence[str]) -> KvManagerFlags:
    """The two engine flags that change the layout, as `spec.engine.extraArgs` sets them
    (vllm/engine/arg_utils.py: `--disable-hybrid-kv-cache-manager`, a boolean with a
    `--no-` form; `--kv-cache-dtype-skip-layers` takes one or more values)."""
    hybrid = True
    skip: list[str] = []
    args = list(extra_args)
    for i, arg in enumerate(args):
        name, _, inline = arg.partition("=")
        if name == "--disable-hybrid-kv-cache-manager":
            hybrid = inline.lower() in ("false", "0") if inline else False
        elif name == "--no-disable-hybrid-kv-cache-manager":
            hybrid = True
        elif name == "--kv-cache-dtype-skip-layers":
            if inline:
                skip.extend(v for v in inline.split(",") if v)
                continue
            for value in args[i + 1 :]:
                if value.startswith("-"):
                    break
                skip.extend(v for v in value.split(",") if v)
    return KvManagerFlags(hybrid, tuple(skip))


def _pages(spec: LayerSpec, max_model_len: int, in_flight: int) -> int:
    if spec.kind == "full":
        return -(-max_model_len // spec.block_size)
    if spec.kind == "sliding":
        tokens = min(spec.window - 1 + in_flight, max_model_len)
        return -(-tokens // spec.block_size) + 1
    if spec.kind == "chunked":
        return -(-min(spec.window + in_flight, max_model_len) // spec.block_size)
    return 1


def _divide(a: int, b: int, what: str) -> int:
    if a % b:
        raise KvLayoutError(f"{what} ({a}) is not divisible by tensor_parallel {b}")
    return a // b


def state_bytes(
    state: RecurrentState,
    tensor_parallel: int,
    mamba_cache_dtype: str = "auto",
    mamba_ssm_cache_dtype: str = "auto",
) -> int:
    """Bytes of one sequence's state in one layer (MambaSpec.page_size_bytes, unpadded)."""
    tp = tensor_parallel
    ssm_name = mamba_ssm_cache_dtype
    if ssm_name == "auto":
        ssm_name = state.ssm_dtype or mamba_cache_dtype
    try:
        conv_bytes = _STATE_DTYPE_BYTES[mamba_cache_dtype]
        ssm_bytes = _STATE_DTYPE_BYTES[ssm_name]
    except KeyError as err:
        raise KvLayoutError(f"unknown mamba cache dtype {err.args[0]!r}") from None
    width = state.conv_kernel - 1
    if state.kind == "mamba1":
        assert state.intermediate_size is not None and state.state_size is not None
        inner = _divide(state.intermediate_size, tp, "mamba intermediate size")
        return inner * width * conv_bytes + inner * state.state_size * ssm_bytes
    if state.kind == "mamba2":
        assert state.intermediate_size is not None and state.state_size is not None
        assert state.num_heads is not None and state.head_dim is not None
        groups = state.n_groups + (0 if state.n_groups % tp == 0 else tp - state.n_groups)
        conv = _divide(state.intermediate_size + 2 * groups * state.state_size, tp, "conv dim")
        heads = _divide(state.num_heads, tp, "mamba heads")
        return conv * width * conv_bytes + heads * state.head_dim * state.state_size * ssm_bytes
    assert state.num_k_heads and state.num_v_heads and state.head_k_dim and state.head_v_dim
    conv_dim = 2 * state.head_k_dim * state.num_k_heads + state.head_v_dim * state.num_v_heads
    conv = _divide(conv_dim, tp, "gated delta net conv dim")
    v_heads = _divide(state.num_v_heads, tp, "linear value heads")
    return conv * width * conv_bytes + v_heads * state.head_v_dim * state.head_k_dim * ssm_bytes


def _skipped(index: int, kind: str, skip_layers: frozenset[str]) -> bool:
    return str(index) in skip_layers or (
        kind == "sliding_attention" and _SLIDING_SKIP in skip_layers
    )


def kv_layout(
    arch: ModelArchitecture,
    kv_cache_dtype: str,
    *,
    tensor_parallel: int = 1,
    block_size: int = _KERNEL_BLOCK,
    hybrid_manager: bool = True,
    skip_layers: frozenset[str] = frozenset(),
    mamba_cache_dtype: str = "auto",
    mamba_ssm_cache_dtype: str = "auto",
) -> KvLayout:
    """The KV-cache groups vLLM builds for this model on one GPU of a TP group."""
    heads = kv_heads_per_gpu(arch, tensor_parallel)
    kinds = arch.layer_kinds
    primary = layer_token_bytes(arch, kv_cache_dtype, heads)
    has_state = any(k in ("mamba", "linear_attention") for k in kinds)
    if has_state and not hybrid_manager:
        raise KvLayoutError(
            "this model keeps Mamba / linear-attention state, which vLLM only runs with the "
            "hybrid KV-cache manager: drop --disable-hybrid-kv-cache-manager"
        )
    quantized_skip = bool(skip_layers) and kv_cache_dtype != "auto"

    # Platform.update_block_size_for_backend: hybrid alignment, then skip-layer alignment.
    block = block_size
    align = max(block_size, _KERNEL_BLOCK)
    state_page = 0
    if has_state:
        assert arch.state is not None
        state_page = state_bytes(
            arch.state, tensor_parallel, mamba_cache_dtype, mamba_ssm_cache_dtype
        )
        block = max(block, align * -(-state_page // (align * primary)))
    shared_page: int | None = None
    if quantized_skip:
        skip_token = layer_token_bytes(arch, "auto", heads)
        if skip_token != primary:
            align = max(block, _KERNEL_BLOCK)
            required = max(skip_token * _KERNEL_BLOCK, block * primary if has_state else 0)
            block = max(block, align * -(-required // (align * primary)))
            shared_page = block * primary

    specs: list[LayerSpec] = []
    for index, kind in enumerate(kinds):
        if kind == "mlp":
            continue
        if kind in ("mamba", "linear_attention"):
            specs.append(LayerSpec("state", block, max(state_page, block * primary), 0, "state"))
            continue
        dtype = "auto" if quantized_skip and _skipped(index, kind, skip_layers) else kv_cache_dtype
        token = layer_token_bytes(arch, dtype, heads)
        if kind == "sliding_attention" and hybrid_manager:
            window = (arch.layer_windows[index] if arch.layer_windows else 0) or arch.sliding_window
            assert window is not None
            page = shared_page if shared_page is not None else _KERNEL_BLOCK * token
            specs.append(LayerSpec("sliding", _KERNEL_BLOCK, page, window, dtype))
        elif kind == "chunked_attention" and hybrid_manager:
            assert arch.attention_chunk_size is not None
            specs.append(
                LayerSpec("chunked", block, block * token, arch.attention_chunk_size, dtype)
            )
        else:
            specs.append(LayerSpec("full", block, block * token, 0, dtype))
    if not specs:
        raise KvLayoutError("the model has no layer that keeps a KV cache or state")

    if len(set(specs)) == 1:
        return KvLayout(
            (KvGroup(specs[0], len(specs)),), len(specs), specs[0].page_bytes, (), hybrid_manager
        )
    return _grouped(_unified(specs), hybrid_manager)


def _unified(specs: list[LayerSpec]) -> list[LayerSpec]:
    """unify_kv_cache_spec_page_size: scale smaller pages' block size, pad Mamba pages."""
    largest = max(s.page_bytes for s in specs)
    out = []
    for spec in specs:
        if spec.page_bytes == largest:
            out.append(spec)
        elif spec.kind == "state":
            out.append(replace(spec, page_bytes=largest))
        elif largest % spec.page_bytes == 0:
            ratio = largest // spec.page_bytes
            out.append(replace(spec, block_size=spec.block_size * ratio, page_bytes=largest))
        else:
            raise KvLayoutError(
                f"vLLM cannot unify KV page sizes {spec.page_bytes:,} and {largest:,} bytes "
                "(not a multiple): this layer mix does not start"
            )
    return out


def _grouped(specs: list[LayerSpec], hybrid_manager: bool) -> KvLayout:
    """_get_kv_cache_groups_uniform_page_size: equal-sized groups, the last one padded."""
    counts = Counter(specs)  # insertion order = first layer of each spec, as vLLM's dict
    fewest, most = min(counts.values()), max(counts.values())
    group_size = most if most < fewest * 1.5 else fewest
    groups: list[KvGroup] = []
    warnings: list[str] = []
    for spec, n in counts.items():
        padding = group_size - n % group_size
        if padding != group_size:
            warnings.append(
                f"Add {padding} padding layers, may waste at most {padding / n * 100:.2f}% "
                "KV cache memory"
            )
        n_groups = -(-n // group_size)
        for i in range(n_groups):
            groups.append(KvGroup(spec, len(range(i, n, n_groups))))
    return KvLayout(tuple(groups), group_size, specs[0].page_bytes, tuple(warnings), hybrid_manager)


def kv_capacity(
    layout: KvLayout, available_bytes: int, max_model_len: int, max_in_flight_tokens: int
) -> tuple[int, float, int]:
    """(blocks, concurrency, tokens) as vLLM computes and logs them."""
    blocks = max(0, available_bytes) // layout.block_bytes
    per_request = layout.pages_per_request(max_model_len, max_in_flight_tokens)
    concurrency = blocks / per_request
    return blocks, concurrency, int(concurrency * max_model_len)
