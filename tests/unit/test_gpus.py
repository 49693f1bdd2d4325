"""GPU catalog: label strings from GFD, GKE and Karpenter resolve to the right product."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvq.catalog.gpus import GpuCatalog, load_gpu_catalog, normalize_gpu_name


@pytest.fixture(scope="module")
def catalog() -> GpuCatalog:
    return load_gpu_catalog()


@pytest.mark.parametrize(
    ("label", "product"),
    [
        # GPU Feature Discovery nvidia.com/gpu.product
        ("NVIDIA-H100-80GB-HBM3", "H100-SXM-80GB"),
        ("Tesla-T4", "T4"),
        ("NVIDIA-A100-SXM4-80GB", "A100-SXM4-80GB"),
        ("NVIDIA-A100-SXM4-40GB", "A100-SXM4-40GB"),
        ("NVIDIA-A100-80GB-PCIe", "A100-PCIE-80GB"),
        ("NVIDIA-A100-PCIE-40GB", "A100-PCIE-40GB"),
        ("NVIDIA-H100-PCIe", "H100-PCIE-80GB"),
        ("NVIDIA-H100-NVL", "H100-NVL-94GB"),
        ("NVIDIA-H200", "H200"),
        ("NVIDIA-GH200-480GB", "GH200-96GB"),
        ("NVIDIA-B200", "B200"),
        ("NVIDIA-L40S", "L40S"),
        ("NVIDIA-A10G", "A10G"),
        ("NVIDIA-GeForce-RTX-4090", "RTX-4090"),
        ("Tesla-V100-SXM2-16GB", "V100-SXM2-16GB"),
        # GKE cloud.google.com/gke-accelerator
        ("nvidia-tesla-t4", "T4"),
        ("nvidia-h100-80gb", "H100-SXM-80GB"),
        ("nvidia-h100-mega-80gb", "H100-SXM-80GB"),
        ("nvidia-l4", "L4"),
        ("nvidia-a100-80gb", "A100-SXM4-80GB"),
        ("nvidia-tesla-a100", "A100-SXM4-40GB"),
        ("nvidia-h200-141gb", "H200"),
        ("nvidia-tesla-v100", "V100-SXM2-16GB"),
        # Karpenter AWS karpenter.k8s.aws/instance-gpu-name
        ("h100", "H100-SXM-80GB"),
        ("a10g", "A10G"),
        ("t4", "T4"),
        ("l4", "L4"),
        ("l40s", "L40S"),
        ("h200", "H200"),
        # nvidia-smi / Azure style, odd case and spacing
        ("NVIDIA H100 80GB HBM3", "H100-SXM-80GB"),
        ("nvidia-TESLA-t4", "T4"),
        ("  NVIDIA L4 ", "L4"),
    ],
)
def test_label_resolves_to_product(catalog: GpuCatalog, label: str, product: str) -> None:
    gpu = catalog.lookup(label)
    assert gpu is not None, label
    assert gpu.product == product


@pytest.mark.parametrize(
    ("memory_mib", "product"),
    [(None, "A100-SXM4-40GB"), (40960, "A100-SXM4-40GB"), (81920, "A100-SXM4-80GB")],
)
def test_karpenter_a100_needs_the_memory_label(
    catalog: GpuCatalog, memory_mib: int | None, product: str
) -> None:
    gpu = catalog.lookup("a100", memory_mib=memory_mib)
    assert gpu is not None
    assert gpu.product == product


def test_unknown_gpu_is_none(catalog: GpuCatalog) -> None:
    assert catalog.lookup("NVIDIA-Quantum-9000") is None
    assert catalog.lookup("") is None


@pytest.mark.parametrize(
    ("product", "cc", "fp8", "family"),
    [
        ("T4", "7.5", False, "turing"),
        ("V100-SXM2-16GB", "7.0", False, "volta"),
        ("A10G", "8.6", False, "ampere"),
        ("A100-SXM4-80GB", "8.0", False, "ampere"),
        ("L4", "8.9", True, "ada"),
        ("RTX-4090", "8.9", True, "ada"),
        ("H100-SXM-80GB", "9.0", True, "hopper"),
        ("GH200-96GB", "9.0", True, "hopper"),
        ("B200", "10.0", True, "blackwell"),
    ],
)
def test_fp8_follows_compute_capability(
    catalog: GpuCatalog, product: str, cc: str, fp8: bool, family: str
) -> None:
    gpu = catalog.lookup(product)
    assert gpu is not None
    assert (gpu.compute_capability_str, gpu.fp8_native, gpu.family) == (cc, fp8, family)


def test_driver_memory_is_what_the_driver_reports(catalog: GpuCatalog) -> None:
    h200 = catalog.lookup("NVIDIA-H200")
    h100 = catalog.lookup("NVIDIA-H100-80GB-HBM3")
    assert h200 is not None and h100 is not None
    assert h200.memory_mib == 143771
    assert h100.memory_mib == 81559


def test_mig_slice_keeps_parent_facts_with_slice_memory(catalog: GpuCatalog) -> None:
    gpu = catalog.lookup("NVIDIA-A100-SXM4-40GB-MIG-3g.20gb")
    assert gpu is not None
    assert (gpu.product, gpu.memory_mib, gpu.mig_profile) == ("A100-SXM4-40GB", 20480, "3g.20gb")
    labelled = catalog.lookup("NVIDIA-A100-SXM4-40GB-MIG-3g.20gb", memory_mib=19968)
    assert labelled is not None and labelled.memory_mib == 19968


def test_time_sliced_product_is_the_parent(catalog: GpuCatalog) -> None:
    gpu = catalog.lookup("NVIDIA-L4-SHARED")
    assert gpu is not None and gpu.product == "L4"


def test_catalog_covers_the_required_products_with_sources(catalog: GpuCatalog) -> None:
    products = {g.product for g in catalog.all()}
    required = {
        "T4", "V100-SXM2-16GB", "A10G", "L4", "L40S", "A100-SXM4-40GB", "A100-SXM4-80GB",
        "A100-PCIE-40GB", "A100-PCIE-80GB", "H100-PCIE-80GB", "H100-SXM-80GB", "H200",
        "GH200-96GB", "B200", "RTX-4090",
    }  # fmt: skip
    assert required <= products
    assert all(g.source.strip() for g in catalog.all())


def test_every_alias_finds_a_row_that_lists_it(catalog: GpuCatalog) -> None:
    for gpu in catalog.all():
        for alias in gpu.aliases:
            found = catalog.lookup(alias, memory_mib=gpu.memory_mib)
            assert found is not None
            assert normalize_gpu_name(alias) in {normalize_gpu_name(a) for a in found.aliases}


def test_cheaper_generations_rank_cheaper(catalog: GpuCatalog) -> None:
    cost = {g.product: g.relative_cost for g in catalog.all()}
    assert cost["T4"] < cost["L4"] < cost["A100-SXM4-80GB"] < cost["H100-SXM-80GB"] < cost["B200"]


def test_catalog_loads_from_another_file(tmp_path: Path) -> None:
    path = tmp_path / "gpus.yaml"
    path.write_text(
        "gpus:\n"
        "  - product: X1\n"
        "    aliases: [ACME-X1]\n"
        "    compute_capability: [9, 0]\n"
        "    memory_mib: 1000\n"
        "    family: hopper\n"
        "    relative_cost: 1.0\n"
        "    source: test\n"
    )
    gpu = load_gpu_catalog(path).lookup("acme-x1")
    assert gpu is not None and gpu.fp8_native
