"""`spec.routing`: the Gateway API HTTPRoute kvq renders for the service."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from kvq.api.base import KubeModel


class ParentRef(KubeModel):
    """A Gateway (or a listener of one) the route attaches to."""

    name: Annotated[str, Field(min_length=1, max_length=253)]
    """The Gateway's name."""
    namespace: Annotated[str | None, Field(min_length=1, max_length=63)] = None
    """Defaults to the InferenceService's namespace."""
    section_name: Annotated[str | None, Field(min_length=1, max_length=253)] = None
    """A listener of the Gateway."""


class RoutingSpec(KubeModel):
    """A Gateway API HTTPRoute for the service: each tier's match to that tier, the rest to
    the default tier."""

    parent_refs: Annotated[list[ParentRef], Field(min_length=1, max_length=8)]
    """The Gateways to attach to."""
    hostnames: Annotated[
        list[Annotated[str, Field(min_length=1, max_length=253)]], Field(max_length=16)
    ] = Field(default_factory=list)
    """Host names the route answers for; all of the Gateway's when empty."""
    inference_pool: bool = False
    """Also render one inference.networking.k8s.io/v1 InferencePool per tier and route to
    them (for gateways that implement the Gateway API Inference Extension)."""
