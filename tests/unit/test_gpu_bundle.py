"""`make gpu-bundle`'s pure steps on small stand-ins: what is never carried, the stripped
wheel, and parts that join back into the same bytes."""

from __future__ import annotations

import hashlib
import json
import subprocess
import tarfile
import zipfile
from pathlib import Path

import pytest

from tests.unit.gpu_tier_support import REPO

import bundle  # isort: skip  (e2e/gpu is on sys.path through gpu_tier_support)


def test_the_device_image_packages_are_never_carried() -> None:
    image = bundle.read_image_packages()
    # torch and the NVIDIA libraries are the image's own build
    assert image["torch"] == "2.11.0"
    assert {"triton", "nvidia-cublas", "transformers", "numpy"} <= set(image)
    # kvq's own runtime needs that the image lacks come with the bundle (vLLM needs them too)
    assert "pydantic" not in image and "pyyaml" in image and "typer" in image


def test_skipped_and_image_packages_do_not_overlap() -> None:
    assert not set(bundle.SKIPPED) & set(bundle.read_image_packages())


def _wheel(path: Path, files: dict[str, bytes]) -> Path:
    record = "".join(f"{name},sha256=x,{len(data)}\n" for name, data in files.items())
    with zipfile.ZipFile(path, "w") as wheel:
        for name, data in files.items():
            wheel.writestr(name, data)
        wheel.writestr("vllm-0.26.0.dist-info/RECORD", record + "vllm-0.26.0.dist-info/RECORD,,\n")
    return path


def test_stripping_removes_the_listed_kernels_and_their_record_lines(tmp_path: Path) -> None:
    source = _wheel(
        tmp_path / "vllm-0.26.0-cp38-abi3-manylinux_2_28_x86_64.whl",
        {
            "vllm/__init__.py": b"",
            "vllm/_C_stable_libtorch.abi3.so": b"core",
            "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so": b"fa2" * 100,
            "vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so": b"fa3",
            "vllm/third_party/fmha_sm100/api.py": b"x",
            "vllm/third_party/deep_gemm/_C.cpython-311-x86_64-linux-gnu.so": b"311",
            "vllm/third_party/deep_gemm/_C.cpython-312-x86_64-linux-gnu.so": b"312",
        },
    )
    stripped, removed = bundle.strip_vllm(source, tmp_path / "out")
    with zipfile.ZipFile(stripped) as wheel:
        names = set(wheel.namelist())
        record = wheel.read("vllm-0.26.0.dist-info/RECORD").decode()
    assert names == {
        "vllm/__init__.py",
        "vllm/_C_stable_libtorch.abi3.so",
        "vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so",
        "vllm/third_party/deep_gemm/_C.cpython-312-x86_64-linux-gnu.so",
        "vllm-0.26.0.dist-info/RECORD",
    }
    assert "_vllm_fa2_C" not in record and "fmha_sm100" not in record
    assert "_vllm_fa3_C" in record
    by_pattern = {r["pattern"]: r for r in removed}
    fa2 = by_pattern[r"vllm/vllm_flash_attn/_vllm_fa2_C\.abi3\.so"]
    assert (fa2["files"], fa2["bytes"]) == (1, 300)
    assert all(r["reason"] for r in removed)


def test_parts_are_under_the_limit_and_join_into_the_tar(tmp_path: Path) -> None:
    wheels = []
    for i in range(3):
        wheel = tmp_path / f"w{i}-1.0-py3-none-any.whl"
        wheel.write_bytes(bytes(range(256)) * 700 * (i + 1))
        wheels.append(wheel)
    out = tmp_path / ".bundle"
    manifest: dict[str, object] = {"bundle": "test"}
    parts = bundle.write_parts(wheels, out, 100_000, manifest)
    assert len(parts) == 11 and all(p.stat().st_size <= 100_000 for p in parts)
    joined = b"".join(p.read_bytes() for p in parts)
    tar_info = manifest["tar"]
    assert isinstance(tar_info, dict)
    assert hashlib.sha256(joined).hexdigest() == tar_info["sha256"]
    (tmp_path / "joined.tar").write_bytes(joined)
    with tarfile.open(tmp_path / "joined.tar") as tar:
        assert sorted(tar.getnames()) == [f"wheels/{w.name}" for w in wheels]
    # every part folder carries the manifest and the checksums of all parts
    for part in parts:
        sums = (part.parent / "SHA256SUMS").read_text().splitlines()
        assert len(sums) == len(parts)
        assert json.loads((part.parent / "manifest.json").read_text())["parts"]


def test_a_corrupt_part_is_refused_on_the_device(tmp_path: Path) -> None:
    wheel = tmp_path / "w-1.0-py3-none-any.whl"
    wheel.write_bytes(b"w" * 5000)
    parts = bundle.write_parts([wheel], tmp_path / ".bundle", 4000, {})
    with parts[0].open("r+b") as f:
        f.write(b"corrupt")
    stash = REPO / "e2e" / "gpu" / "stash-part.sh"
    done = subprocess.run(
        [str(stash), str(parts[0].parent)],
        env={"KVQ_GPU_BUNDLE_DIR": str(tmp_path / "dest"), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 1
    assert "checksum mismatch" in done.stderr


@pytest.mark.parametrize("n", [17, 28, 34, 39])
def test_pip_is_offered_every_manylinux_glibc_the_device_has(n: int) -> None:
    assert f"manylinux_2_{n}_x86_64" in bundle.platform_args()
