"""`spec.model`: which model to serve, where its weights are, and how to fetch them."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import Field

from kvq.api.architecture import ArchitectureSpec
from kvq.api.base import KubeModel
from kvq.api.environment import EnvFromList, EnvList
from kvq.api.model_cache import ModelCacheSpec
from kvq.api.names import ObjectKey, ObjectName
from kvq.api.rules import FieldRule, Rule

_URI_RE = r"^(hf://[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*|pvc://[a-z0-9]([-a-z0-9]*[a-z0-9])?(/[^/]+)*/?|s3://[a-z0-9][a-z0-9.-]*[a-z0-9](/[^/]+)*/?)$"

_URI_MESSAGE = "must be hf://<org>/<name>, pvc://<claim>[/<path>] or s3://<bucket>[/<path>]"


def _uri_ok(value: str) -> bool:
    return re.fullmatch(_URI_RE, value) is not None


ModelUri = Annotated[
    str,
    Field(max_length=512),
    FieldRule(cel=f"self.matches('{_URI_RE}')", message=_URI_MESSAGE, check=_uri_ok),
]


class SecretKeyRef(KubeModel):
    """A key of a Secret in the InferenceService's namespace. kvq passes it by reference only."""

    name: ObjectName
    """Name of the Secret."""
    key: ObjectKey
    """Key within the Secret whose value is the token."""


class AwqSpec(KubeModel):
    """The AWQ-quantized variant of the model, used by the `awq` fallback rung."""

    uri: ModelUri
    """Where the AWQ weights live (same schemes as spec.model.uri)."""


class ModelSpec(KubeModel):
    """Which model to serve."""

    kube_rules = (
        Rule(
            cel="!has(self.revision) || self.uri.startsWith('hf://')",
            message="revision applies only to hf:// models",
            check=lambda m: m.revision is None or m.uri.startswith("hf://"),
            field_path=".revision",
        ),
        Rule(
            cel="!has(self.cache) || !self.uri.startsWith('pvc://')",
            message="cache applies to hf:// and s3:// models: a pvc:// model is read from "
            "its claim as it is",
            check=lambda m: m.cache is None or not m.uri.startswith("pvc://"),
            field_path=".cache",
        ),
    )

    uri: ModelUri
    """hf://<org>/<name> (Hugging Face), pvc://<claim>[/<path>] or s3://<bucket>[/<path>]."""
    revision: Annotated[str | None, Field(min_length=1, max_length=128)] = None
    """Hugging Face revision (branch, tag or commit) to pin."""
    architecture: ArchitectureSpec | None = None
    """Architecture facts; needed when the model is not in kvq's catalog."""
    awq: AwqSpec | None = None
    """AWQ-weight variant of the same model for the awq fallback rung."""
    token_secret_ref: SecretKeyRef | None = None
    """Secret key holding a Hugging Face token; passed as HF_TOKEN by reference, to the
    download step when there is a cache, else to the engine."""
    cache: ModelCacheSpec | None = None
    """Keep the downloaded model in a volume and download it before the engine starts;
    without a cache the engine downloads hf:// models itself at every start and streams
    s3:// models."""
    env: EnvList = Field(default_factory=list)
    """Environment for fetching the model (AWS_REGION, AWS_ENDPOINT_URL, HF_ENDPOINT, ...;
    credentials by valueFrom only): given to the download step, and to the engine when
    there is no cache (the engine then downloads or streams the model itself)."""
    env_from: EnvFromList = Field(default_factory=list)
    """Secrets and ConfigMaps whose keys become that environment (e.g. a Secret with
    AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY)."""
