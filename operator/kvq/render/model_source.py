"""Model URIs (hf://, pvc://, s3://) turned into what the engine container needs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvq.fetch.layout import MODEL_LINK
from kvq.render.settings import RenderError

MODEL_VOLUME = "model"
MODELS_ROOT = "/models"


@dataclass(frozen=True)
class ModelSource:
    model_arg: str
    """What the engine gets as the model: a Hub id, a local path or an object-store URI."""
    revision: str | None = None
    load_format: str | None = None
    volume: dict[str, Any] | None = None
    mount: dict[str, Any] | None = None


def resolve_model_source(uri: str, revision: str | None, *, cached: bool = False) -> ModelSource:
    """What the engine is given for `uri`; `cached`: spec.model.cache is set, so an hf:// or
    s3:// model is downloaded by the init container and the engine reads the local copy
    (the revision was pinned by the download)."""
    scheme, _, rest = uri.partition("://")
    rest = rest.strip("/")
    if cached and scheme in ("hf", "s3"):
        return ModelSource(model_arg=MODEL_LINK)
    if scheme == "hf":
        return ModelSource(model_arg=rest, revision=revision)
    if scheme == "pvc":
        claim, _, sub_path = rest.partition("/")
        mount_path = f"{MODELS_ROOT}/{claim}"
        return ModelSource(
            model_arg=f"{mount_path}/{sub_path}" if sub_path else mount_path,
            volume={
                "name": MODEL_VOLUME,
                "persistentVolumeClaim": {"claimName": claim, "readOnly": True},
            },
            mount={"name": MODEL_VOLUME, "mountPath": mount_path, "readOnly": True},
        )
    if scheme == "s3":
        # Streamed straight from the bucket by the Run:ai model streamer.
        return ModelSource(model_arg=f"s3://{rest}", load_format="runai_streamer")
    raise RenderError(f"model uri {uri!r}: the scheme must be hf://, pvc:// or s3://")
