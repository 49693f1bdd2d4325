"""Known accuracy problems of an FP8 KV cache in vLLM, as sourced facts (fp8_accuracy.yaml).

`match_accuracy_facts` is pure: an engine version, a GPU, a model and a KV dtype in, the
facts that apply out. `kvq plan` prints them; the operator writes them to status. They
warn, never refuse: only a probe of the model itself (kvq probe, spec.quality) can say
whether a given deployment is affected.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any, Literal

import yaml

from kvq.catalog.engines import Minor, parse_minor

Severity = Literal["high", "low"]
Attention = Literal["gqa", "mla"]

# The dtypes these facts may name: an FP8 KV cache's --kv-cache-dtype values.
FP8_DTYPES = frozenset({"fp8", "fp8_e4m3", "fp8_e5m2"})


class AccuracyCatalogError(ValueError):
    """A fact the loader cannot read (a missing source, an unknown field value)."""


@dataclass(frozen=True)
class AccuracyFact:
    id: str
    title: str
    severity: Severity
    dtypes: frozenset[str]
    symptom: str
    workaround: str
    sources: tuple[str, ...]
    since: Minor | None = None
    until: Minor | None = None
    fixed_in: str = ""
    cc_min: Minor | None = None
    cc_max: Minor | None = None
    attention: Attention | None = None
    architectures: frozenset[str] = frozenset()
    names: tuple[str, ...] = ()
    min_max_model_len: int | None = None
    reported: str = ""

    def summary(self) -> str:
        """One line for a table note, a condition message or an event: what, and where from."""
        return f"{self.title} ({self.id}): {self.symptom} Workaround: {self.workaround} " + (
            f"Source: {' '.join(self.sources)}"
        )


@dataclass(frozen=True)
class AccuracyQuery:
    """What one deployment runs. None: not known, so facts that need it do not match."""

    engine_version: str
    dtype: str
    """The --kv-cache-dtype value (fp8, fp8_e4m3, ...); auto and others match nothing."""
    compute_capability: Minor | None = None
    architecture: str | None = None
    """The Hugging Face class (config.json "architectures")."""
    attention: str | None = None
    """gqa or mla (kvq.catalog.models.ModelArchitecture.attention)."""
    model_names: tuple[str, ...] = ()
    """The model's URI and catalog name, matched against a fact's `names`."""
    max_model_len: int | None = None


def match_accuracy_facts(
    facts: Sequence[AccuracyFact], query: AccuracyQuery
) -> tuple[AccuracyFact, ...]:
    """The facts that apply to `query`, in catalog order."""
    if query.dtype not in FP8_DTYPES:
        return ()
    minor = parse_minor(query.engine_version)
    return tuple(f for f in facts if _matches(f, query, minor))


def _matches(fact: AccuracyFact, query: AccuracyQuery, minor: Minor) -> bool:
    if query.dtype not in fact.dtypes:
        return False
    if (fact.since is not None and minor < fact.since) or (
        fact.until is not None and minor > fact.until
    ):
        return False
    if fact.cc_min is not None or fact.cc_max is not None:
        cc = query.compute_capability
        if cc is None:
            return False
        if (fact.cc_min is not None and cc < fact.cc_min) or (
            fact.cc_max is not None and cc >= fact.cc_max
        ):
            return False
    if fact.attention is not None and query.attention != fact.attention:
        return False
    if fact.min_max_model_len is not None and (
        query.max_model_len is None or query.max_model_len < fact.min_max_model_len
    ):
        return False
    return _model_matches(fact, query)


def _model_matches(fact: AccuracyFact, query: AccuracyQuery) -> bool:
    if not fact.architectures and not fact.names:
        return True
    if query.architecture is not None and query.architecture in fact.architectures:
        return True
    names = [n.lower() for n in query.model_names]
    return any(pattern in name for pattern in fact.names for name in names)


@cache
def load_accuracy_facts() -> tuple[AccuracyFact, ...]:
    text = resources.files("kvq.catalog").joinpath("fp8_accuracy.yaml").read_text("utf-8")
    return parse_accuracy_facts(yaml.safe_load(text))


def parse_accuracy_facts(raw: dict[str, Any]) -> tuple[AccuracyFact, ...]:
    facts = tuple(_fact(entry) for entry in raw.get("facts") or [])
    ids = [f.id for f in facts]
    if len(ids) != len(set(ids)):
        raise AccuracyCatalogError(f"fp8_accuracy.yaml: duplicate ids in {ids}")
    return facts


def _fact(entry: dict[str, Any]) -> AccuracyFact:
    fid = str(entry.get("id") or "")
    sources = tuple(str(s) for s in entry.get("sources") or [])
    if not fid or not sources or not all(s.startswith("https://") for s in sources):
        raise AccuracyCatalogError(f"fp8_accuracy.yaml: {fid or entry!r} needs https sources")
    dtypes = frozenset(str(d) for d in entry.get("dtypes") or [])
    if not dtypes or not dtypes <= FP8_DTYPES:
        raise AccuracyCatalogError(f"fp8_accuracy.yaml: {fid}: dtypes {sorted(dtypes)}")
    severity = entry.get("severity")
    attention = entry.get("attention")
    if severity not in ("high", "low") or attention not in (None, "gqa", "mla"):
        raise AccuracyCatalogError(f"fp8_accuracy.yaml: {fid}: severity or attention")
    return AccuracyFact(
        id=fid,
        title=_text(entry["title"]),
        severity=severity,
        dtypes=dtypes,
        symptom=_text(entry["symptom"]),
        workaround=_text(entry["workaround"]),
        sources=sources,
        since=_minor(entry.get("since")),
        until=_minor(entry.get("until")),
        fixed_in=_text(entry.get("fixed_in") or ""),
        cc_min=_minor(entry.get("cc_min")),
        cc_max=_minor(entry.get("cc_max")),
        attention=attention,
        architectures=frozenset(str(a) for a in entry.get("architectures") or []),
        names=tuple(str(n).lower() for n in entry.get("names") or []),
        min_max_model_len=entry.get("min_max_model_len"),
        reported=_text(entry.get("reported") or ""),
    )


def _minor(value: object) -> Minor | None:
    return None if value is None else parse_minor(str(value))


def _text(value: object) -> str:
    return " ".join(str(value).split())
