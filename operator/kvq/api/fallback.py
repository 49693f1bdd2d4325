"""`spec.fallback`: what kvq may do when the requested KV-cache dtype cannot run."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from kvq.api.base import KubeModel
from kvq.api.rules import UniqueItems

FallbackRung = Literal["auto", "awq"]


class FallbackSpec(KubeModel):
    """What kvq may do when the requested KV-cache dtype cannot run."""

    enabled: bool = True
    """Fall back at all; when false, kvq reports the failure and changes nothing."""
    rungs: Annotated[
        list[FallbackRung],
        Field(
            min_length=1,
            max_length=2,
            json_schema_extra={"x-kubernetes-list-type": "set", "default": ["auto"]},
        ),
        UniqueItems(),
    ] = Field(default_factory=lambda: list[FallbackRung](["auto"]))
    """Ordered rungs: auto (same model, uncompressed KV) and awq (spec.model.awq with auto KV).
    Each is tried at most once per spec generation."""
