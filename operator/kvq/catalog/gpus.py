"""GPU facts by product name, as node labels spell it.

The rows live in `gpus.yaml` (one source per row). `GpuCatalog.lookup` accepts the
strings GPU Feature Discovery, GKE and Karpenter put on nodes and resolves short names
that cover several products (Karpenter's `a100`) with the memory label when there is one.
"""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, computed_field

# Words that label writers put around the model name and that never tell products apart.
_NOISE_WORDS = frozenset({"nvidia", "tesla", "geforce"})
# GFD renames the product of time-sliced GPUs ("...-SHARED") and MIG slices ("...-MIG-1g.5gb").
_SHARED_SUFFIX = re.compile(r"-shared$")
_MIG_SUFFIX = re.compile(r"-mig-(\d+)g\.(\d+)gb$")
_FP8_MIN_CC = (8, 9)
# A memory hint this close (relative) to a row's memory picks that row.
_MEMORY_TOLERANCE = 0.10


class GpuModel(BaseModel):
    """One GPU product: what placement and the planner need to know about it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    product: str
    aliases: tuple[str, ...] = ()
    compute_capability: tuple[int, int]
    memory_mib: int = Field(gt=0)
    cuda_total_mib: int | None = Field(default=None, gt=0)
    family: str
    relative_cost: float = Field(gt=0)
    source: str
    mig_profile: str | None = None

    @computed_field  # type: ignore[prop-decorator]
    @property
    def fp8_native(self) -> bool:
        """FP8 tensor cores: Ada (8.9), Hopper (9.0), Blackwell (10.x) and later."""
        return self.compute_capability >= _FP8_MIN_CC

    @property
    def compute_capability_str(self) -> str:
        major, minor = self.compute_capability
        return f"{major}.{minor}"


def normalize_gpu_name(name: str) -> str:
    """Lower-case, dash-separated, no vendor words: `NVIDIA A100-SXM4-80GB` -> `a100-sxm4-80gb`."""
    words = re.split(r"[\s_\-/]+", name.strip().lower())
    return "-".join(w for w in words if w and w not in _NOISE_WORDS)


class GpuCatalog:
    """All known GPUs, indexed by every normalized alias."""

    def __init__(self, gpus: list[GpuModel]) -> None:
        self._gpus = list(gpus)
        self._by_alias: dict[str, list[GpuModel]] = {}
        for gpu in self._gpus:
            for alias in {gpu.product, *gpu.aliases}:
                rows = self._by_alias.setdefault(normalize_gpu_name(alias), [])
                if gpu not in rows:
                    rows.append(gpu)

    def all(self) -> list[GpuModel]:
        return list(self._gpus)

    def lookup(self, name: str, memory_mib: int | None = None) -> GpuModel | None:
        """The GPU a label names, or None when kvq does not know it.

        `memory_mib` (GFD `nvidia.com/gpu.memory`, Karpenter `instance-gpu-memory`) picks
        between products that share a short name; without it the smallest-memory
        candidate is returned, so capacity is never overstated.
        """
        key = normalize_gpu_name(name)
        key = _SHARED_SUFFIX.sub("", key)
        mig = _MIG_SUFFIX.search(key)
        if mig:
            key = key[: mig.start()]
        gpu = self._match(key, memory_mib if mig is None else None)
        if gpu is None or mig is None:
            return gpu
        # A MIG slice is a fraction of the parent: its memory is the label's or the profile's.
        slice_mib = memory_mib if memory_mib is not None else int(mig.group(2)) * 1024
        return gpu.model_copy(
            update={
                "memory_mib": slice_mib,
                "cuda_total_mib": None,
                "mig_profile": f"{mig.group(1)}g.{mig.group(2)}gb",
            }
        )

    def _match(self, key: str, memory_mib: int | None) -> GpuModel | None:
        words = key.split("-")
        # Exact alias first, then drop trailing words ("h100-80gb-hbm3-foo" -> "h100-80gb-hbm3").
        for end in range(len(words), 0, -1):
            candidates = self._by_alias.get("-".join(words[:end]))
            if candidates:
                return _pick_by_memory(candidates, memory_mib)
        return None


def _pick_by_memory(candidates: list[GpuModel], memory_mib: int | None) -> GpuModel:
    if len(candidates) == 1 or memory_mib is None:
        return min(candidates, key=lambda g: g.memory_mib)
    best = min(candidates, key=lambda g: abs(g.memory_mib - memory_mib))
    if abs(best.memory_mib - memory_mib) <= _MEMORY_TOLERANCE * best.memory_mib:
        return best
    return min(candidates, key=lambda g: g.memory_mib)


def load_gpu_catalog(path: Path | None = None) -> GpuCatalog:
    """Read the GPU catalog: the packaged `gpus.yaml` unless `path` names another file."""
    if path is None:
        text = resources.files("kvq.catalog").joinpath("gpus.yaml").read_text(encoding="utf-8")
    else:
        text = path.read_text(encoding="utf-8")
    data: dict[str, Any] = yaml.safe_load(text)
    return GpuCatalog([GpuModel.model_validate(row) for row in data["gpus"]])
