#!/usr/bin/env python3
"""Build the offline vLLM bundle for the GPU tier (`make gpu-bundle`), on a machine with PyPI.

What it makes, under e2e/gpu/.bundle/ (git-ignored):

    part-1/ part-2/ ...   one tar slice each (under 60 MB, so one fits a device call)
                          plus manifest.json and SHA256SUMS (the same in every part)

The tar holds cp312 manylinux x86_64 wheels: vLLM (with kernel libraries we never load
removed, see STRIPPED) and every runtime requirement the device image lacks (see
image-packages.txt; torch and the NVIDIA libraries are the image's own and never
carried). Downloads and the stripped wheel are cached under
${KVQ_CACHE:-~/.cache/kvq}/gpu-bundle/vllm-<version>/, so a rebuild is offline and quick.

Usage: bundle.py [--out DIR] [--part-mib N]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
VLLM_VERSION = "0.26.0"
PYTHON_VERSION = "3.12"
# 54 MiB (56.6 MB): under the 60 MB a part may have, with room for the working tree that
# travels beside it (64 MiB per device call in all).
PART_MIB = 54
DEFAULT_OUT = HERE / ".bundle"
BUNDLE_NAME = f"kvq-gpu-bundle-vllm-{VLLM_VERSION}"

# Requirements of vllm 0.26.0 left out on purpose, with why (none is imported on the
# paths the tier runs: the OpenAI server, dense, MoE, MLA, sliding-window and Gated
# DeltaNet decoders on Hopper with FlashAttention 3, FlashMLA and Triton).
SKIPPED: dict[str, str] = {
    "flashinfer-python": "FlashInfer is not carried; VLLM_USE_FLASHINFER_SAMPLER=0 keeps the "
    "sampler off it and Hopper's attention backends are FlashAttention 3 and Triton",
    "tilelang": "TileLang kernels (sparse/MLA attention paths) are imported lazily",
    "nvidia-cutlass-dsl": "CuTe DSL kernels: vLLM logs 'cuteDSL not available' and goes on",
    "quack-kernels": "needs nvidia-cutlass-dsl; used by Blackwell paths only",
    "tokenspeed-mla": "MLA kernels of a Blackwell-only backend (TOKENSPEED_MLA: "
    "platforms/cuda.py lists it for SM10x only); Hopper's MLA backends are FlashAttention 3 "
    "(FLASH_ATTN_MLA), FlashMLA and Triton",
    "humming-kernels": "weight-quantized GEMMs; the tier runs bf16 weights",
    "torchcodec": "video decoding for multimodal inputs",
    "pynvvideocodec": "video decoding for multimodal inputs",
    "nvidia-cudnn-frontend": "used through FlashInfer's cuDNN paths only",
    "fastsafetensors": "a --load-format the tier does not use (weights are dummy)",
}

# Files removed from the vllm wheel, with why. Each pattern is matched against the path
# inside the wheel (fnmatch-style via re below).
STRIPPED: dict[str, str] = {
    r"vllm/vllm_flash_attn/_vllm_fa2_C\.abi3\.so": "FlashAttention 2 kernels: on Hopper vLLM "
    "picks FlashAttention 3 (its import is optional: FA2_AVAILABLE becomes False)",
    r"vllm/vllm-rs": "the Rust frontend binary, used only with VLLM_USE_RUST_FRONTEND=1",
    r"vllm/third_party/deep_gemm/_C\.cpython-3(?:10|11|13|14)-x86_64-linux-gnu\.so": "DeepGEMM "
    "builds for other Python versions (the device runs 3.12)",
    r"vllm/third_party/fmha_sm100/.*": "Blackwell (SM100) sparse attention, imported lazily by "
    "MiniMax-M3 only",
}


@dataclass(frozen=True)
class Paths:
    cache: Path
    wheels: Path
    stripped: Path
    out: Path


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def read_image_packages(path: Path = HERE / "image-packages.txt") -> dict[str, str | None]:
    """Package name -> version (None when unknown) of what the device image holds."""
    packages: dict[str, str | None] = {}
    for raw in path.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        name, _, version = line.partition("==")
        packages[normalize(name)] = version.strip() or None
    return packages


def run(command: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    print("+", " ".join(command), file=sys.stderr)
    return subprocess.run(command, check=True, text=True, **kwargs)  # type: ignore[call-overload,no-any-return]


def find_uv() -> str:
    found = shutil.which("uv")
    if found:
        return found
    venv = subprocess.run(
        [str(REPO / "e2e" / "scripts" / "venv.sh")], check=True, capture_output=True, text=True
    ).stdout.strip()
    return f"{venv}/bin/uv"


def platform_args() -> list[str]:
    """pip matches manylinux_2_N exactly: name every N the device's glibc (2.39) covers."""
    args = ["--python-version", PYTHON_VERSION, "--implementation", "cp", "--only-binary=:all:"]
    for n in range(39, 4, -1):
        args += ["--platform", f"manylinux_2_{n}_x86_64"]
    return [*args, "--platform", "manylinux2014_x86_64", "--platform", "manylinux1_x86_64"]


def download(requirements: list[str], into: Path) -> None:
    into.mkdir(parents=True, exist_ok=True)
    missing = [r for r in requirements if not _have_wheel(r, into)]
    if not missing:
        return
    command = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(into)]
    run([*command, *platform_args(), *missing])


def _have_wheel(requirement: str, into: Path) -> bool:
    name, _, version = requirement.partition("==")
    prefix = f"{re.sub(r'[-.]+', '_', name).lower()}-{version}-"
    return any(w.name.lower().startswith(prefix) for w in into.glob("*.whl"))


def resolve(paths: Paths, image: dict[str, str | None]) -> list[str]:
    """Pinned requirements (name==version) of vllm that the image lacks, SKIPPED left out."""
    lock = paths.cache / "lock.txt"
    work = paths.cache / "resolve"
    work.mkdir(parents=True, exist_ok=True)
    (work / "requirements.in").write_text(f"vllm=={VLLM_VERSION}\n")
    # An override whose marker is never true drops the package from the resolution.
    dropped = sorted({*image, *SKIPPED})
    (work / "overrides.txt").write_text("".join(f"{n}; python_version < '0'\n" for n in dropped))
    key = hashlib.sha256((work / "overrides.txt").read_bytes()).hexdigest()[:12]
    stamp = paths.cache / "lock.key"
    if not lock.exists() or not stamp.exists() or stamp.read_text() != key:
        run(
            [
                find_uv(),
                "pip",
                "compile",
                str(work / "requirements.in"),
                "--override",
                str(work / "overrides.txt"),
                "--python-version",
                PYTHON_VERSION,
                "--python-platform",
                "x86_64-manylinux_2_28",
                "--no-header",
                "--no-annotate",
                "-q",
                "-o",
                str(lock),
            ]
        )
        stamp.write_text(key)
    pins = [line.strip() for line in lock.read_text().splitlines() if "==" in line]
    carried = [p for p in pins if normalize(p.split("==")[0]) not in image]
    return [p for p in carried if normalize(p.split("==")[0]) not in SKIPPED]


def strip_vllm(wheel: Path, into: Path) -> tuple[Path, list[dict[str, object]]]:
    """A copy of the vllm wheel without the STRIPPED files (RECORD rewritten to match)."""
    patterns = {re.compile(p): why for p, why in STRIPPED.items()}
    key = hashlib.sha256(json.dumps(STRIPPED, sort_keys=True).encode()).hexdigest()[:12]
    target = into / key / wheel.name
    removed_path = target.with_suffix(".removed.json")
    if target.exists() and removed_path.exists():
        return target, json.loads(removed_path.read_text())
    target.parent.mkdir(parents=True, exist_ok=True)
    removed: dict[str, dict[str, object]] = {}
    partial = target.with_suffix(".partial")
    with zipfile.ZipFile(wheel) as source, zipfile.ZipFile(partial, "w") as sink:
        record_name = next(n for n in source.namelist() if n.endswith(".dist-info/RECORD"))
        kept: set[str] = set()
        for info in source.infolist():
            rule = next((p for p in patterns if p.fullmatch(info.filename)), None)
            if rule is not None:
                entry = removed.setdefault(
                    rule.pattern,
                    {"pattern": rule.pattern, "reason": patterns[rule], "files": 0, "bytes": 0},
                )
                entry["files"] = int(entry["files"]) + 1
                entry["bytes"] = int(entry["bytes"]) + info.file_size
                continue
            if info.filename == record_name:
                continue
            kept.add(info.filename)
            sink.writestr(info, source.read(info), compress_type=zipfile.ZIP_DEFLATED)
        record = source.read(record_name).decode()
        lines = [ln for ln in record.splitlines() if ln.split(",", 1)[0] in kept]
        lines.append(f"{record_name},,")
        sink.writestr(record_name, "\n".join(lines) + "\n", compress_type=zipfile.ZIP_DEFLATED)
    partial.rename(target)
    summary = list(removed.values())
    removed_path.write_text(json.dumps(summary, indent=1))
    return target, summary


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_parts(
    wheels: list[Path], out: Path, part_bytes: int, manifest: dict[str, object]
) -> list[Path]:
    """One uncompressed tar of the wheels (they are zips already), cut into parts."""
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    tar_path = out / f"{BUNDLE_NAME}.tar"
    with tarfile.open(tar_path, "w", format=tarfile.PAX_FORMAT) as tar:
        for wheel in sorted(wheels, key=lambda w: w.name):
            info = tar.gettarinfo(str(wheel), arcname=f"wheels/{wheel.name}")
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            with wheel.open("rb") as f:
                tar.addfile(info, f)
    size = tar_path.stat().st_size
    count = -(-size // part_bytes)
    part_names: list[dict[str, object]] = []
    parts: list[Path] = []
    with tar_path.open("rb") as f:
        for index in range(1, count + 1):
            folder = out / f"part-{index}"
            folder.mkdir()
            part = folder / f"{BUNDLE_NAME}.tar.{index:02d}"
            part.write_bytes(f.read(part_bytes))
            parts.append(part)
            part_names.append(
                {
                    "folder": folder.name,
                    "file": part.name,
                    "bytes": part.stat().st_size,
                    "sha256": sha256(part),
                }
            )
    manifest["tar"] = {"file": tar_path.name, "bytes": size, "sha256": sha256(tar_path)}
    manifest["parts"] = part_names
    tar_path.unlink()
    sums = "".join(f"{p['sha256']}  {p['file']}\n" for p in part_names)
    document = json.dumps(manifest, indent=1) + "\n"
    for index in range(1, count + 1):
        folder = out / f"part-{index}"
        (folder / "manifest.json").write_text(document)
        (folder / "SHA256SUMS").write_text(sums)
    (out / "manifest.json").write_text(document)
    return parts


def build(out: Path, part_mib: int) -> dict[str, object]:
    cache_root = Path(os.environ.get("KVQ_CACHE", Path.home() / ".cache" / "kvq"))
    cache = cache_root / "gpu-bundle" / f"vllm-{VLLM_VERSION}"
    paths = Paths(cache, cache / "wheels", cache / "stripped", out)
    image = read_image_packages()
    requirements = resolve(paths, image)
    download(requirements, paths.wheels)
    vllm_pin = f"vllm=={VLLM_VERSION}"
    deps = [r for r in requirements if r != vllm_pin]
    wheels = [_wheel_for(r, paths.wheels) for r in deps]
    stripped, removed = strip_vllm(_wheel_for(vllm_pin, paths.wheels), paths.stripped)
    original = _wheel_for(vllm_pin, paths.wheels)
    manifest: dict[str, object] = {
        "bundle": BUNDLE_NAME,
        "vllm": VLLM_VERSION,
        "python": PYTHON_VERSION,
        "platform": "manylinux x86_64",
        "install": "e2e/gpu/install-bundle.sh (pip install --no-index --no-deps --target)",
        "environment": {"VLLM_USE_FLASHINFER_SAMPLER": "0"},
        "vllm_wheel": {
            "file": stripped.name,
            "original_bytes": original.stat().st_size,
            "stripped_bytes": stripped.stat().st_size,
            "removed": removed,
        },
        "wheels": [
            {"file": w.name, "bytes": w.stat().st_size, "sha256": sha256(w)}
            for w in sorted([stripped, *wheels], key=lambda w: w.name)
        ],
        "not_carried_image_has_them": sorted(image),
        "not_carried_on_purpose": SKIPPED,
    }
    parts = write_parts([stripped, *wheels], out, part_mib << 20, manifest)
    print(f"{len(parts)} parts under {out.relative_to(REPO) if out.is_relative_to(REPO) else out}")
    for part in parts:
        print(f"  {part.parent.name}/{part.name}  {part.stat().st_size / 1e6:.1f} MB")
    return manifest


def _wheel_for(requirement: str, wheels: Path) -> Path:
    name, _, version = requirement.partition("==")
    prefix = f"{re.sub(r'[-.]+', '_', name).lower()}-{version}-"
    found = [w for w in wheels.glob("*.whl") if w.name.lower().startswith(prefix)]
    if len(found) != 1:
        raise SystemExit(f"expected one wheel for {requirement} in {wheels}, found {found}")
    return found[0]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--part-mib", type=int, default=PART_MIB)
    args = parser.parse_args(argv)
    build(args.out, args.part_mib)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
