"""`spec.tiers`: other tiers of the same model, each with its own KV cache, replicas and
request match."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import Field

from kvq.api.autoscaling import AutoscalingSpec
from kvq.api.base import KubeModel
from kvq.api.kv_cache import KvCacheSpec
from kvq.api.rules import FieldRule, ListMapKeys

TIER_HEADER = "x-kvq-tier"

# The Gateway API Inference Extension's body-based router copies the request's OpenAI
# `model` into this header, so a route can match on the model name.
MODEL_HEADER = "x-gateway-model-name"

_TIER_NAME_RE = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"


class HeaderMatch(KubeModel):
    """An exact request-header match."""

    name: Annotated[str, Field(min_length=1, max_length=256, pattern=r"^[a-z0-9!#$%&'*+.^_`|~-]+$")]
    """Header name, in lower case (header names are case-insensitive on the wire)."""
    value: Annotated[str, Field(min_length=1, max_length=4096)]
    """Exact header value."""


class TierMatch(KubeModel):
    """Which requests go to a tier (any of the matches)."""

    header: HeaderMatch | None = None
    """A header and value; default `x-kvq-tier: <tier name>`."""
    model: Annotated[str | None, Field(min_length=1, max_length=256)] = None
    """An OpenAI model name that means this tier: the engine serves under it too, and the
    route matches the x-gateway-model-name header the gateway's body-based router sets."""


class TierSpec(KubeModel):
    """Another tier of the same model, with its own KV cache and replicas (e.g. an
    uncompressed `auto` cache for requests that need the highest accuracy)."""

    name: Annotated[
        str,
        Field(min_length=1, max_length=20),
        FieldRule(
            cel=f"self.matches('{_TIER_NAME_RE}') && self != 'default'",
            message="tier names are short DNS labels (lowercase letters, digits and '-'), "
            "not 'default' (the main spec is the default tier)",
            check=lambda v: re.fullmatch(_TIER_NAME_RE, v) is not None and v != "default",
        ),
    ]
    """Tier name; its objects are named <InferenceService>-<name>."""
    kv_cache: KvCacheSpec = Field(default_factory=KvCacheSpec, json_schema_extra={"default": {}})
    """The tier's KV cache (default auto: no compression)."""
    replicas: Annotated[int, Field(ge=0, le=1000)] = 1
    """The tier's replicas."""
    autoscaling: AutoscalingSpec | None = None
    """The tier's autoscaling (KEDA scales the tier's Deployment)."""
    match: TierMatch | None = None
    """The requests that reach this tier; default the header x-kvq-tier: <name>."""

    def header(self) -> tuple[str, str]:
        """The (lower-cased name, value) of the tier's header match."""
        found = self.match.header if self.match else None
        return (found.name, found.value) if found else (TIER_HEADER, self.name)

    def model_alias(self) -> str | None:
        return self.match.model if self.match else None


def _tier_keys_unique(tiers: list[TierSpec]) -> bool:
    headers = [t.header() for t in tiers]
    aliases = [a for t in tiers if (a := t.model_alias()) is not None]
    return len(set(headers)) == len(headers) and len(set(aliases)) == len(aliases)


_TIER_HEADER_NAME_CEL = (
    f"(has(%s.match) && has(%s.match.header) ? %s.match.header.name : '{TIER_HEADER}')"
)
_TIER_HEADER_VALUE_CEL = "(has(%s.match) && has(%s.match.header) ? %s.match.header.value : %s.name)"


def _header_cel(var: str) -> str:
    return (
        _TIER_HEADER_NAME_CEL % (var, var, var)
        + " + ':' + "
        + _TIER_HEADER_VALUE_CEL % (var, var, var, var)
    )


TierList = Annotated[
    list[TierSpec],
    Field(max_length=4),
    ListMapKeys(("name",)),
    FieldRule(
        cel=f"self.all(a, self.filter(b, {_header_cel('b')} == "
        f"{_header_cel('a')}).size() == 1) && "
        "self.all(a, !has(a.match) || !has(a.match.model) || self.filter(b, "
        "has(b.match) && has(b.match.model) && b.match.model == a.match.model).size() == 1)",
        message="two tiers have the same match (header and value, or model name): each "
        "request must reach one tier",
        check=_tier_keys_unique,
    ),
]
