"""The GPU this machine has, as nvidia-smi reports it, mapped to kvq's catalog and a pool."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass

from kvq.catalog.gpus import GpuModel, load_gpu_catalog
from kvq.placement.pool import NodePool, pool_for_gpu

QUERY = "name,memory.total,driver_version"
NVIDIA_SMI = ["nvidia-smi", f"--query-gpu={QUERY}", "--format=csv,noheader,nounits"]


class UnknownGpuError(LookupError):
    """nvidia-smi names a GPU kvq's catalog does not know."""


@dataclass(frozen=True)
class GpuInfo:
    """What nvidia-smi says about the GPUs of this machine (all of one product)."""

    name: str
    memory_mib: int
    driver: str
    count: int


def parse_nvidia_smi(csv_text: str) -> GpuInfo:
    """`NVIDIA H200, 143771, 580.159.04` per GPU -> one GpuInfo (the first GPU's product)."""
    rows = [
        [cell.strip() for cell in line.split(",")] for line in csv_text.splitlines() if line.strip()
    ]
    if not rows:
        raise UnknownGpuError("nvidia-smi lists no GPU")
    name, memory, driver = rows[0][:3]
    others = {r[0] for r in rows[1:] if r[0] != name}
    if others:
        raise UnknownGpuError(f"mixed GPUs on one machine: {name} and {', '.join(sorted(others))}")
    return GpuInfo(name=name, memory_mib=int(float(memory)), driver=driver, count=len(rows))


def detect_gpus() -> GpuInfo:
    out = subprocess.run(NVIDIA_SMI, check=True, capture_output=True, text=True).stdout
    return parse_nvidia_smi(out)


def catalog_gpu(info: GpuInfo) -> GpuModel:
    """kvq's catalog row for the GPU, matched by name and memory as a node label would be."""
    gpu = load_gpu_catalog().lookup(info.name, info.memory_mib)
    if gpu is None:
        raise UnknownGpuError(
            f"kvq's GPU catalog has no {info.name!r} ({info.memory_mib} MiB): add a row to "
            "operator/kvq/catalog/gpus.yaml"
        )
    return gpu


def pool_for(info: GpuInfo) -> NodePool:
    """The pool kvq would place on: one node of this GPU, all of its GPUs allocatable."""
    return pool_for_gpu(catalog_gpu(info), gpus_per_node=info.count)
