"""`spec.quality`: the answer-quality gate after each rollout of a quantized KV cache."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import Field

from kvq.api.base import KubeModel
from kvq.api.environment import EnvVar
from kvq.api.rules import FieldRule, Rule, UniqueItems
from kvq.api.scheduling import Toleration

QualitySuite = Literal["needle", "json", "repetition", "agreement"]

_REQUIREMENT_RE = (
    r"^[A-Za-z][A-Za-z0-9_.]*(>=|<=|>|<)(baseline([+-][0-9]+([.][0-9]+)?)?|-?[0-9]+([.][0-9]+)?)$"
)


class QualitySpec(KubeModel):
    """Check the answers after each rollout of a quantized KV cache (`kvq probe` in a Job):
    needles retrieved from long contexts, valid JSON, no repetition loops, and agreement with
    an uncompressed tier. A failure can fall back to the next rung (QualityRegression)."""

    kube_rules = (
        Rule(
            cel="!self.suites.exists(s, s == 'agreement') || has(self.baselineTier)",
            message="the agreement suite compares with a baseline: set baselineTier (a tier "
            "of this service with the auto cache)",
            check=lambda q: "agreement" not in q.suites or q.baseline_tier is not None,
            field_path=".suites",
        ),
    )

    suites: Annotated[
        list[QualitySuite],
        Field(
            min_length=1,
            max_length=4,
            json_schema_extra={
                "x-kubernetes-list-type": "set",
                "default": ["needle", "json", "repetition"],
            },
        ),
        UniqueItems(),
    ] = Field(default_factory=lambda: list[QualitySuite](["needle", "json", "repetition"]))
    """Which checks run."""
    require: Annotated[
        list[
            Annotated[
                str,
                Field(max_length=128),
                FieldRule(
                    cel=f"self.matches('{_REQUIREMENT_RE}')",
                    message="a requirement is SCORE OP THRESHOLD without spaces, e.g. "
                    "needle.accuracy>=0.9 or agreement.tokenAgreement>=baseline-0.1",
                    check=lambda v: re.fullmatch(_REQUIREMENT_RE, v) is not None,
                ),
            ]
        ],
        Field(max_length=16),
    ] = Field(default_factory=list)
    """Thresholds on the probe's scores; the probe's defaults when empty (see kvq probe)."""
    baseline_tier: Annotated[str | None, Field(min_length=1, max_length=20)] = None
    """A tier of this service to compare with (agreement; thresholds relative to it)."""
    on_failure: Literal["fallback", "report"] = "report"
    """fallback: a failed check moves the ladder to the next rung (QualityRegression);
    report: status and an Event only."""
    period_hours: Annotated[int | None, Field(ge=1, le=8760)] = None
    """Also run every this many hours (besides after each rollout)."""
    timeout_seconds: Annotated[int, Field(ge=60, le=86400)] = 1800
    """Longest a probe may run; it is then Unknown (never a failure)."""
    tolerations: Annotated[list[Toleration], Field(max_length=16)] = Field(default_factory=list)
    """Where the probe Job's pod may run (it needs no GPU)."""
    env: Annotated[list[EnvVar], Field(max_length=16)] = Field(default_factory=list)
    """Extra environment of the probe (e.g. a proxy)."""
