"""What each vLLM version accepts: KV dtypes, flags, block sizes, metric names, defaults.

The facts live in `engines.yaml` (one source per entry); this module turns them into an
`EngineCapability` for one version and answers the questions the renderer and the pool
chooser ask ("does 0.20 have --swap-space?", "does fp8_e5m2 run on CC 9.0?").
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any, Literal

import yaml

# The engine image kvq deploys when the InferenceService names none.
DEFAULT_IMAGE = "vllm/vllm-openai:v0.26.0"

Minor = tuple[int, int]
Launcher = Literal["api_server", "serve"]
Backend = Literal["FLASH_ATTN", "FLASHINFER", "TRITON_ATTN"]
CpuTierMode = Literal["swap", "offload", "none"]
"""swap: V0's --swap-space; offload: V1's KV offloading; none: no CPU tier on this engine."""
OffloadBackend = Literal["native", "lmcache"]
Platform = Literal["cuda", "rocm", "xpu", "cpu"]

# The API's `int8` has no upstream value of the same name (DESIGN: vLLM has no plain int8).
_INT8_ENGINE_VALUE = "int8_per_token_head"
_QUANTIZED_PREFIXES = ("fp8", "int8", "int4", "nvfp4", "turboquant")

_VERSION = re.compile(r"^v?(\d+)\.(\d+)(?:\.(\d+))?(?:[.+\-].*)?$")


class EngineVersionError(ValueError):
    """A vLLM version kvq has no catalog entry for, or one it cannot read."""


@dataclass(frozen=True)
class Verdict:
    """Whether the engine takes a setting, the value to pass it, and why."""

    ok: bool
    engine_value: str | None
    reason: str


@dataclass(frozen=True)
class Sourced:
    """A catalog fact's origin, so a refusal can say where the rule comes from."""

    source: str
    verified: bool


@dataclass(frozen=True)
class MemoryProfile:
    """How one vLLM version profiles memory before sizing the KV cache (engines.yaml
    kv_memory_profile): the planner's runner and CUDA-graph rules, with their source."""

    runner: Literal["v2-dense", "v2"]
    graphs_subtracted: Literal["v1-runner", "all"]
    origin: Sourced


# kvq's default engine (0.26), for plans made without an engine version.
DEFAULT_MEMORY_PROFILE = MemoryProfile(
    "v2-dense", "v1-runner", Sourced("vllm 0.26.0 wheel (engines.yaml kv_memory_profile)", True)
)


@dataclass(frozen=True)
class FlagRange:
    flag: str
    since: Minor
    until: Minor | None
    origin: Sourced


@dataclass(frozen=True)
class BlockSizeRule:
    """Block sizes a version's argument parser accepts."""

    choices: tuple[int, ...] | None  # None: any positive integer
    origin: Sourced

    def allows(self, block_size: int) -> bool:
        if block_size <= 0:
            return False
        return self.choices is None or block_size in self.choices


@dataclass(frozen=True)
class BackendBlockRule:
    multiple_of: int | None
    choices: tuple[int, ...] | None
    origin: Sourced

    def allows(self, block_size: int) -> bool:
        if self.choices is not None and block_size not in self.choices:
            return False
        return self.multiple_of is None or block_size % self.multiple_of == 0

    def describe(self) -> str:
        if self.choices is not None:
            return "one of " + ", ".join(str(c) for c in self.choices)
        return f"a multiple of {self.multiple_of}"


@dataclass(frozen=True)
class HardwareRule:
    dtypes: frozenset[str]
    cc_min: Minor | None
    cc_max: Minor | None
    ok: bool
    reason: str
    origin: Sourced

    def matches(self, dtype: str, cc: Minor) -> bool:
        if dtype not in self.dtypes:
            return False
        if self.cc_min is not None and cc < self.cc_min:
            return False
        return self.cc_max is None or cc < self.cc_max


@dataclass(frozen=True)
class OffloadBackendRule:
    """One `--kv-offloading-backend` on one engine version."""

    backend: str
    ok: bool
    reason: str
    origin: Sourced
    connector: str | None = None
    """The KV connector vLLM runs for it (the engine's log names it)."""
    platforms: frozenset[str] | None = None
    """Where its worker runs (None: not recorded)."""
    needs_lmcache: bool = False


@dataclass(frozen=True)
class CpuTierRule:
    """How an engine version keeps KV-cache blocks in host memory, if it does."""

    mode: CpuTierMode
    origin: Sourced
    note: str = ""
    """What a user should know when it runs (e.g. swap is V0-only)."""
    reason: str = ""
    """Why there is no CPU tier (mode none)."""
    backends: dict[str, OffloadBackendRule] = field(default_factory=dict)


@dataclass(frozen=True)
class CpuTierVerdict:
    """Whether a CPU tier with this backend runs on this engine and image, and how."""

    ok: bool
    mode: CpuTierMode
    reason: str
    backend: str | None = None
    """The offloading backend rendered (offload mode only)."""
    connector: str | None = None
    note: str = ""


@dataclass(frozen=True)
class EngineMetrics:
    """Prometheus names of the engine metrics kvq reads."""

    kv_cache_usage: str
    requests_running: str = "vllm:num_requests_running"
    requests_waiting: str = "vllm:num_requests_waiting"
    preemptions: str = "vllm:num_preemptions_total"
    requests_finished: str = "vllm:request_success_total"
    cache_config_info: str = "vllm:cache_config_info"


@dataclass(frozen=True)
class EngineCapability:
    """Everything kvq needs to know about one vLLM version."""

    version: str
    minor: Minor
    kv_cache_dtypes: frozenset[str]
    flags: frozenset[str]
    absent_flags: dict[str, FlagRange]
    """Catalogued flags this version lacks, with the versions that have them."""
    load_formats: frozenset[str]
    block_sizes: BlockSizeRule
    backend_block_sizes: dict[str, BackendBlockRule]
    metrics: EngineMetrics
    default_gpu_memory_utilization: float
    launcher: Launcher
    hardware: tuple[HardwareRule, ...]
    known_slow: tuple[HardwareRule, ...] = ()
    """Dtypes that run but were measured much slower than auto (the rule's `ok` is True)."""
    cpu_tier: CpuTierRule = field(
        default_factory=lambda: CpuTierRule("none", Sourced("not catalogued", False))
    )
    images_without_lmcache: frozenset[str] = frozenset()
    """Image repositories kvq has no record of shipping LMCache (the stock vllm-openai)."""
    memory_profile: MemoryProfile = DEFAULT_MEMORY_PROFILE
    """How this version profiles memory before sizing the KV cache."""

    def cpu_tier_verdict(
        self, backend: OffloadBackend, image: str, platform: Platform = "cuda"
    ) -> CpuTierVerdict:
        """Whether a CPU tier (spec.memory.swapSpaceGiB > 0) runs here, and as what."""
        tier = self.cpu_tier
        where = f"vLLM {self.version}"
        if tier.mode == "none":
            return CpuTierVerdict(
                False, "none", f"{where} has no CPU tier for the KV cache: {tier.reason}"
            )
        if tier.mode == "swap":
            return CpuTierVerdict(True, "swap", f"{where} swaps with --swap-space", note=tier.note)
        rule = tier.backends.get(backend)
        if rule is None:
            return CpuTierVerdict(
                False, "offload", f"{where} has no KV offloading backend {backend}"
            )
        if not rule.ok:
            return CpuTierVerdict(
                False, "offload", f"{where}, KV offloading backend {backend}: {rule.reason}"
            )
        if rule.platforms is not None and platform not in rule.platforms:
            return CpuTierVerdict(
                False,
                "offload",
                f"{where}, KV offloading backend {backend}: its {rule.connector} runs on "
                f"{', '.join(sorted(rule.platforms))} only, not {platform} ('CPU Offloading is "
                "currently only supported on CUDA-alike and XPU GPUs')",
            )
        if rule.needs_lmcache and not self.image_has_lmcache(image):
            return CpuTierVerdict(
                False,
                "offload",
                f"{where}, KV offloading backend lmcache imports LMCache, and kvq has no "
                f"record that {_repository(image)} ships it (vLLM's Dockerfile installs it "
                "only when built with INSTALL_KV_CONNECTORS=true): use backend native, or "
                "an image with LMCache in spec.engine.image",
            )
        return CpuTierVerdict(
            True, "offload", f"{where} offloads through {rule.connector}", backend, rule.connector
        )

    def image_has_lmcache(self, image: str) -> bool:
        """An image kvq has no record against is trusted: the user built it."""
        return _repository(image) not in self.images_without_lmcache

    def has_flag(self, flag: str) -> bool:
        return flag in self.flags

    def kv_dtype_verdict(self, requested_dtype: str, compute_capability: Minor) -> Verdict:
        """Whether `requested_dtype` (an API value) runs on this engine and this GPU."""
        if requested_dtype == "auto":
            return Verdict(True, "auto", "auto keeps the model's own dtype for the KV cache")
        engine_value = self.engine_value(requested_dtype)
        if engine_value is None:
            return Verdict(False, None, self._missing_dtype_reason(requested_dtype))
        cc_text = f"{compute_capability[0]}.{compute_capability[1]}"
        for rule in self.hardware:
            if rule.matches(engine_value, compute_capability):
                prefix = f"vLLM {self.version}, {engine_value} on compute capability {cc_text}: "
                return Verdict(rule.ok, engine_value if rule.ok else None, prefix + rule.reason)
        if engine_value.startswith(_QUANTIZED_PREFIXES):
            return Verdict(
                False,
                None,
                f"kvq has no record that vLLM {self.version} runs {engine_value} "
                f"on compute capability {cc_text}",
            )
        return Verdict(True, engine_value, f"vLLM {self.version} accepts {engine_value}")

    def likely_backend(self, engine_dtype: str, compute_capability: Minor) -> Backend | None:
        """The attention backend vLLM picks for this dtype and GPU (None: not known)."""
        if engine_dtype == _INT8_ENGINE_VALUE:
            return "TRITON_ATTN"
        hopper = (9, 0) <= compute_capability < (10, 0)
        if engine_dtype == "fp8_e5m2" or (engine_dtype.startswith("fp8") and not hopper):
            return "FLASHINFER"
        if compute_capability >= (8, 0):
            return "FLASH_ATTN"
        return None

    def block_size_verdict(self, block_size: int, backend: str | None) -> Verdict:
        """Whether the engine (and the attention backend it will pick) takes this block size."""
        if not self.block_sizes.allows(block_size):
            allowed = (
                "a positive integer"
                if self.block_sizes.choices is None
                else "one of " + ", ".join(str(c) for c in self.block_sizes.choices)
            )
            return Verdict(
                False,
                None,
                f"vLLM {self.version} takes a block size of {allowed}, not {block_size}",
            )
        rule = self.backend_block_sizes.get(backend) if backend else None
        if rule is not None and not rule.allows(block_size):
            return Verdict(
                False,
                None,
                f"the {backend} attention backend of vLLM {self.version} needs a block size "
                f"{rule.describe()}, not {block_size}",
            )
        return Verdict(True, str(block_size), f"vLLM {self.version} takes block size {block_size}")

    def dropped_reason(self, flag: str) -> str:
        """Why a flag this version lacks is not rendered (for status)."""
        known = self.absent_flags.get(flag)
        if known is None:
            return f"vLLM {self.version} has no {flag}"
        until = f" to {_fmt(known.until)}" if known.until else " on"
        return f"vLLM {self.version} has no {flag} (vLLM has it from {_fmt(known.since)}{until})"

    def slow_warning(self, requested_dtype: str, compute_capability: Minor) -> str | None:
        """A measured slowdown of this dtype on this GPU family, None where none is known."""
        engine_value = self.engine_value(requested_dtype)
        for rule in self.known_slow:
            if engine_value is not None and rule.matches(engine_value, compute_capability):
                return f"{engine_value} is slow here: {rule.reason}"
        return None

    def engine_value(self, requested: str) -> str | None:
        """The `--kv-cache-dtype` value for an API dtype, None if this version lacks it."""
        if requested == "int8":
            return _INT8_ENGINE_VALUE if _INT8_ENGINE_VALUE in self.kv_cache_dtypes else None
        return requested if requested in self.kv_cache_dtypes else None

    def _missing_dtype_reason(self, requested: str) -> str:
        if requested == "int8":
            return (
                f"vLLM {self.version} has no int8 KV cache: int8 maps to "
                f"{_INT8_ENGINE_VALUE}, which vLLM has from 0.22 on; use fp8 or a newer engine"
            )
        return f"vLLM {self.version} does not accept --kv-cache-dtype {requested}"


@dataclass(frozen=True)
class EngineCatalog:
    first: Minor
    last: Minor
    raw: dict[str, Any]
    # Built once per version: every decision asks for its engine's capability.
    _built: dict[str, EngineCapability] = field(
        default_factory=dict, init=False, compare=False, repr=False
    )

    def capability(self, version: str) -> EngineCapability:
        """The capability of one vLLM version ("0.26.0", "v0.26.0", "0.26")."""
        minor = parse_minor(version)
        if not self.first <= minor <= self.last:
            raise EngineVersionError(
                f"vLLM {version} is outside kvq's engine catalog "
                f"({_fmt(self.first)} to {_fmt(self.last)}): use an image in that range "
                "or set spec.engine.version to the version the image runs"
            )
        plain = version.removeprefix("v")
        if plain not in self._built:
            self._built[plain] = _build_capability(self.raw, plain, minor)
        return self._built[plain]


def parse_minor(version: str) -> Minor:
    match = _VERSION.match(version.strip())
    if match is None:
        raise EngineVersionError(f"cannot read a vLLM version from {version!r}")
    return int(match.group(1)), int(match.group(2))


def version_from_image(image: str) -> str | None:
    """The vLLM version an image tag names (`...:v0.26.0-cu128` -> "0.26.0"), else None."""
    name = image.split("@", 1)[0]
    last = name.rsplit("/", 1)[-1]
    if ":" not in last:
        return None
    tag = last.rsplit(":", 1)[1]
    match = _VERSION.match(tag)
    if match is None:
        return None
    patch = match.group(3) or "0"
    return f"{match.group(1)}.{match.group(2)}.{patch}"


@cache
def load_engine_catalog() -> EngineCatalog:
    text = resources.files("kvq.catalog").joinpath("engines.yaml").read_text(encoding="utf-8")
    raw = yaml.safe_load(text)
    return EngineCatalog(first=parse_minor(raw["first"]), last=parse_minor(raw["last"]), raw=raw)


def _repository(image: str) -> str:
    """`docker.io/vllm/vllm-openai:v0.26.0@sha256:...` -> "vllm/vllm-openai"."""
    name = image.split("@", 1)[0]
    head, _, last = name.rpartition("/")
    repository = f"{head}/{last.split(':', 1)[0]}" if head else last.split(":", 1)[0]
    for registry in ("docker.io/", "index.docker.io/", "registry-1.docker.io/"):
        repository = repository.removeprefix(registry)
    return repository.removeprefix("library/")


def _fmt(minor: Minor) -> str:
    return f"{minor[0]}.{minor[1]}"


def _origin(entry: dict[str, Any]) -> Sourced:
    return Sourced(source=str(entry["source"]), verified=bool(entry.get("verified", False)))


def _in_range(entry: dict[str, Any], minor: Minor) -> bool:
    since = parse_minor(entry["since"]) if "since" in entry else None
    until = parse_minor(entry["until"]) if "until" in entry else None
    return (since is None or since <= minor) and (until is None or minor <= until)


def _one(entries: list[dict[str, Any]], minor: Minor, fact: str) -> dict[str, Any]:
    found = [e for e in entries if _in_range(e, minor)]
    if len(found) != 1:
        raise EngineVersionError(
            f"engine catalog: {len(found)} '{fact}' entries cover {_fmt(minor)}"
        )
    return found[0]


def _cc(text: str | None) -> Minor | None:
    return None if text is None else parse_minor(str(text))


def _build_capability(raw: dict[str, Any], version: str, minor: Minor) -> EngineCapability:
    dtypes = {d for e in raw["kv_cache_dtypes"] if _in_range(e, minor) for d in e["add"]}
    flags = {e["flag"] for e in raw["flags"] if _in_range(e, minor)}
    absent = {
        e["flag"]: FlagRange(
            flag=e["flag"],
            since=parse_minor(e["since"]),
            until=parse_minor(e["until"]) if "until" in e else None,
            origin=_origin(e),
        )
        for e in raw["flags"]
        if not _in_range(e, minor)
    }
    formats = {f for e in raw["load_formats"] if _in_range(e, minor) for f in e["add"]}
    block = _one(raw["block_sizes"], minor, "block_sizes")
    backend_rules = {
        name: BackendBlockRule(
            multiple_of=rule.get("multiple_of"),
            choices=tuple(rule["choices"]) if "choices" in rule else None,
            origin=_origin(rule),
        )
        for name, rule in raw["backend_block_sizes"].items()
    }
    hardware = _hardware_rules(raw["hardware"], minor)
    known_slow = _hardware_rules(raw.get("known_slow", []), minor)
    tier = _one(raw["kv_cpu_tier"], minor, "kv_cpu_tier")
    return EngineCapability(
        version=version,
        minor=minor,
        kv_cache_dtypes=frozenset(dtypes),
        flags=frozenset(flags),
        absent_flags=absent,
        load_formats=frozenset(formats),
        block_sizes=BlockSizeRule(
            choices=tuple(block["choices"]) if "choices" in block else None,
            origin=_origin(block),
        ),
        backend_block_sizes=backend_rules,
        metrics=EngineMetrics(
            kv_cache_usage=_one(raw["kv_cache_usage_metric"], minor, "metric")["name"]
        ),
        default_gpu_memory_utilization=float(
            _one(raw["default_gpu_memory_utilization"], minor, "utilization")["value"]
        ),
        launcher=_one(raw["launcher"], minor, "launcher")["style"],
        hardware=hardware,
        known_slow=known_slow,
        cpu_tier=CpuTierRule(
            mode=tier["mode"],
            origin=_origin(tier),
            note=str(tier.get("note", "")),
            reason=str(tier.get("reason", "")),
            backends={
                rule["backend"]: OffloadBackendRule(
                    backend=rule["backend"],
                    ok=bool(rule["ok"]),
                    reason=str(rule["reason"]),
                    origin=_origin(rule),
                    connector=rule.get("connector"),
                    platforms=frozenset(rule["platforms"]) if "platforms" in rule else None,
                    needs_lmcache=bool(rule.get("needs_lmcache", False)),
                )
                for rule in raw["kv_offload_backends"]
                if _in_range(rule, minor)
            },
        ),
        images_without_lmcache=frozenset(
            entry["image"] for entry in raw["lmcache_images"] if not entry["ok"]
        ),
        memory_profile=_memory_profile(_one(raw["kv_memory_profile"], minor, "kv_memory_profile")),
    )


def _memory_profile(entry: dict[str, Any]) -> MemoryProfile:
    runner, graphs = entry["runner"], entry["graphs_subtracted"]
    if runner not in ("v2-dense", "v2") or graphs not in ("v1-runner", "all"):
        raise EngineVersionError(f"engine catalog: unknown kv_memory_profile {entry}")
    return MemoryProfile(runner, graphs, _origin(entry))


def _hardware_rules(entries: list[dict[str, Any]], minor: Minor) -> tuple[HardwareRule, ...]:
    return tuple(
        HardwareRule(
            dtypes=frozenset(rule["dtypes"]),
            cc_min=_cc(rule.get("cc_min")),
            cc_max=_cc(rule.get("cc_max")),
            ok=bool(rule.get("ok", True)),
            reason=str(rule["reason"]),
            origin=_origin(rule),
        )
        for rule in entries
        if _in_range(rule, minor)
    )
