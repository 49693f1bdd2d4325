"""The rule that refuses, at `kubectl apply`, a CPU tier the engine version cannot keep.

spec.memory.swapSpaceGiB (with spec.memory.offloadBackend) becomes V0 swap or V1 KV
offloading depending on the engine (kvq.catalog `kv_cpu_tier`); on some versions neither
runs. The engine version is known from the spec alone (spec.engine.version, else the
image's tag, else kvq's default image), so the CRD refuses those combinations with CEL
built from the engine catalog, and `kvq validate` runs the same check in Python. What is
not a fact of the version (whether an image ships LMCache) is judged by the operator and
reported in status.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from kvq.api.rules import Rule
from kvq.catalog.engines import (
    DEFAULT_IMAGE,
    EngineVersionError,
    Minor,
    OffloadBackend,
    load_engine_catalog,
    parse_minor,
    version_from_image,
)

BACKENDS: tuple[OffloadBackend, ...] = ("native", "lmcache")


@cache
def refused_minors(backend: OffloadBackend) -> tuple[Minor, ...]:
    """Catalogued versions on which a CPU tier with `backend` cannot run (image aside)."""
    catalog = load_engine_catalog()
    out = []
    major, minor = catalog.first
    while (major, minor) <= catalog.last:
        capability = catalog.capability(f"{major}.{minor}")
        # An image of one's own: the version's facts only, not the stock image's.
        if not capability.cpu_tier_verdict(backend, image="").ok:
            out.append((major, minor))
        minor += 1
    return tuple(out)


def _spec_minor(spec: Any) -> Minor | None:
    """The engine version the spec names (None: it names none kvq can read)."""
    engine = spec.engine
    version = engine.version or version_from_image(engine.image or DEFAULT_IMAGE)
    if version is None:
        return None
    try:
        return parse_minor(version)
    except EngineVersionError:
        return None


def _keeps_tier(spec: Any) -> bool:
    memory = spec.memory
    if not memory.swap_space_gib:
        return True
    minor = _spec_minor(spec)
    return minor is None or minor not in refused_minors(memory.offload_backend)


def _minors_pattern(minors: tuple[Minor, ...]) -> str:
    """A regex group of the minor versions (`(11|12|13)`), every major being 0."""
    assert all(major == 0 for major, _ in minors), "the catalog has vLLM 0.x only"
    return "(" + "|".join(str(minor) for _, minor in minors) + ")"


def _version_cel(minors: tuple[Minor, ...]) -> str:
    """CEL: the spec's engine version is one of `minors` (read as version_from_image does:
    a version field, else the image tag after the last ':' of the last path segment)."""
    group = _minors_pattern(minors)
    version = f"^v?0+[.]0*{group}([.][0-9]+)?$"
    tag = f":v?0+[.]0*{group}([.][0-9]+)?([.+-][^/:@]*)?(@.*)?$"
    default = version_from_image(DEFAULT_IMAGE)
    assert default is not None
    default_refused = parse_minor(default) in minors
    return (
        f"(has(self.engine) && has(self.engine.version) ? "
        f"self.engine.version.matches('{version}') : "
        f"(has(self.engine) && has(self.engine.image) ? "
        f"self.engine.image.matches('{tag}') : {str(default_refused).lower()}))"
    )


def _ranges(minors: list[Minor]) -> str:
    """`0.8-0.10, 0.14-0.33`: runs of consecutive minor versions."""
    runs: list[list[Minor]] = []
    for minor in minors:
        if runs and runs[-1][-1][1] + 1 == minor[1]:
            runs[-1].append(minor)
        else:
            runs.append([minor])
    return ", ".join(
        f"{r[0][0]}.{r[0][1]}" + (f"-{r[-1][0]}.{r[-1][1]}" if len(r) > 1 else "") for r in runs
    )


def _message() -> str:
    catalog = load_engine_catalog()
    every = [(0, m) for m in range(catalog.first[1], catalog.last[1] + 1)]
    modes = {m: catalog.capability(f"{m[0]}.{m[1]}").cpu_tier.mode for m in every}
    offload = {
        backend: _ranges(
            [m for m in every if modes[m] == "offload" and m not in refused_minors(backend)]
        )
        for backend in BACKENDS
    }
    none = _ranges([m for m in every if modes[m] == "none"])
    return (
        "memory.swapSpaceGiB asks for a CPU tier of the KV cache that this engine version "
        f"cannot keep: vLLM {_ranges([m for m in every if modes[m] == 'swap'])} swap "
        f"(--swap-space); KV offloading runs with offloadBackend native on vLLM "
        f"{offload['native']} and lmcache on vLLM {offload['lmcache']}; vLLM {none} keeps "
        "none. Set swapSpaceGiB to 0, or choose another engine version or backend"
    )


def _cel() -> str:
    clauses = []
    for backend in BACKENDS:
        minors = refused_minors(backend)
        if not minors:
            continue
        chosen = (
            "(!has(self.memory.offloadBackend) || self.memory.offloadBackend == 'native')"
            if backend == "native"
            else "(has(self.memory.offloadBackend) && self.memory.offloadBackend == 'lmcache')"
        )
        clauses.append(f"({chosen} && {_version_cel(minors)})")
    refused = " || ".join(clauses) or "false"
    return (
        "!has(self.memory) || !has(self.memory.swapSpaceGiB) || "
        f"self.memory.swapSpaceGiB == 0.0 || !({refused})"
    )


def cpu_tier_rule() -> Rule:
    """The spec-level rule (field path .memory.swapSpaceGiB)."""
    return Rule(
        cel=_cel(),
        message=_message(),
        check=_keeps_tier,
        field_path=".memory.swapSpaceGiB",
    )


__all__ = ["BACKENDS", "cpu_tier_rule", "refused_minors"]
