"""The InferenceService resource (`kvq.dev/v1alpha1`): metadata, spec and status; its group,
version and names are in `kvq.api.keys`."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field

from kvq.api.base import KubeModel
from kvq.api.rules import Rule
from kvq.api.spec import InferenceServiceSpec
from kvq.api.status import InferenceServiceStatus

# The name becomes the Deployment's and the Service's; a Service name is a DNS-1035 label.
_NAME_RE = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"


class ObjectMeta(KubeModel, extra="allow"):
    """The parts of metadata kvq reads; the rest is kept as the API server sent it."""

    name: str
    namespace: str | None = None
    uid: str | None = None
    generation: int | None = None
    resource_version: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)


def _name_ok(isvc: InferenceService) -> bool:
    name = isvc.metadata.name
    return len(name) <= 63 and re.fullmatch(_NAME_RE, name) is not None


class InferenceService(KubeModel):
    """A vLLM deployment with a quantized KV cache, placed on GPUs that can run it."""

    kube_rules = (
        Rule(
            cel=f"self.metadata.name.size() <= 63 && self.metadata.name.matches('{_NAME_RE}')",
            message="metadata.name must be a DNS-1035 label of at most 63 characters "
            "(lowercase letters, digits and '-', starting with a letter): it names the Service",
            check=_name_ok,
        ),
    )

    api_version: Literal["kvq.dev/v1alpha1"] = "kvq.dev/v1alpha1"
    kind: Literal["InferenceService"] = "InferenceService"
    metadata: ObjectMeta
    spec: InferenceServiceSpec
    status: InferenceServiceStatus | None = None

    @classmethod
    def from_kube(cls, body: dict[str, Any]) -> InferenceService:
        return cls.model_validate(body)
