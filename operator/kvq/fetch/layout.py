"""Where a model lives in the cache volume (pure: the renderer and the fetcher agree here).

    <cache>/hub/                          Hugging Face's own cache layout (HF_HUB_CACHE):
                                          blobs shared by every revision, one snapshot per commit
    <cache>/s3/<bucket>/<key>             objects of s3:// models, under their own keys
    <cache>/.kvq/verified/...             what `kvq fetch` has hashed already (skipped next time)

The engine never sees the cache's layout: the fetcher points a link in the pod's own
emptyDir at the exact snapshot it fetched, and the engine is given that link.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

CACHE_MOUNT = "/kvq-cache"
"""Where the cache volume is mounted, in the init container and (read-only) in the engine."""
MODEL_LINK_DIR = "/kvq-model"
"""The pod's own small emptyDir: the link to the fetched model and the fetcher's scratch."""
MODEL_LINK = f"{MODEL_LINK_DIR}/model"
"""What the engine is given as its model: a link to the fetched snapshot or prefix."""
FETCH_HOME = f"{MODEL_LINK_DIR}/.home"
"""HOME, HF_HOME and TMPDIR of the fetcher (its image's root filesystem is read-only)."""

_HUB = "hub"
_S3 = "s3"
_VERIFIED = ".kvq/verified"


@dataclass(frozen=True)
class ModelRef:
    """A model URI taken apart: hf://org/name or s3://bucket/prefix."""

    scheme: str
    repo_or_bucket: str
    """hf: org/name; s3: the bucket."""
    prefix: str = ""
    """s3 only: the key prefix (no leading or trailing slash)."""

    @property
    def uri(self) -> str:
        tail = f"/{self.prefix}" if self.prefix else ""
        return f"{self.scheme}://{self.repo_or_bucket}{tail}"


def parse_model_uri(uri: str) -> ModelRef:
    """hf://org/name or s3://bucket[/prefix]; anything else is refused."""
    scheme, sep, rest = uri.partition("://")
    rest = rest.strip("/")
    if not sep or not rest:
        raise ValueError(f"not a model URI: {uri!r}")
    if scheme == "hf":
        if rest.count("/") != 1:
            raise ValueError(f"hf:// URIs name one repository, hf://<org>/<name>: {uri!r}")
        return ModelRef("hf", rest)
    if scheme == "s3":
        bucket, _, prefix = rest.partition("/")
        return ModelRef("s3", bucket, prefix.strip("/"))
    raise ValueError(f"kvq fetch downloads hf:// and s3:// models, not {uri!r}")


def hub_cache_dir(cache: str) -> str:
    """HF_HUB_CACHE inside the cache volume."""
    return f"{cache}/{_HUB}"


def hub_repo_dir(cache: str, repo_id: str) -> str:
    """huggingface_hub's folder of one model repository (models--org--name)."""
    return f"{hub_cache_dir(cache)}/models--{repo_id.replace('/', '--')}"


def s3_dir(cache: str, ref: ModelRef) -> str:
    """Where the objects under an s3:// prefix are kept (their keys below the bucket)."""
    tail = f"/{ref.prefix}" if ref.prefix else ""
    return f"{cache}/{_S3}/{ref.repo_or_bucket}{tail}"


def verified_record(cache: str, ref: ModelRef, version: str) -> str:
    """The record of files already hashed for one version (a commit, or an s3 prefix)."""
    if ref.scheme == "hf":
        name = ref.repo_or_bucket.replace("/", "--")
        return f"{cache}/{_VERIFIED}/hf/{name}/{version}.json"
    digest = hashlib.sha256(ref.prefix.encode()).hexdigest()[:16]
    return f"{cache}/{_VERIFIED}/s3/{ref.repo_or_bucket}/{digest}.json"


def select_model_files(names: list[str]) -> list[str]:
    """The files a vLLM engine loads, as vLLM itself picks them.

    Weights in one format only: safetensors when there are any, else PyTorch .bin, else
    .pt (a repository that ships both would otherwise be downloaded twice); never the
    `original/` checkpoints some repositories carry beside the Hugging Face ones.
    Everything else (config, tokenizer, generation config) is kept.
    """
    names = [n for n in names if not n.startswith("original/") and not n.endswith("/")]
    weights = {".safetensors", ".bin", ".pt", ".pth"}
    for suffix in (".safetensors", ".bin", ".pt"):
        if any(n.endswith(suffix) for n in names):
            drop = weights - {suffix}
            # The safetensors index goes with safetensors only, and so on.
            if suffix != ".bin":
                drop.add(".bin.index.json")
            if suffix != ".safetensors":
                drop.add(".safetensors.index.json")
            return sorted(n for n in names if not any(n.endswith(d) for d in drop))
    return sorted(names)
