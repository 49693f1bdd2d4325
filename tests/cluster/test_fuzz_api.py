"""Generated InferenceServices: `kvq validate` and the real API server agree, and every valid
one renders manifests the API server accepts.

Documents come from tests/fuzz_strategies.py (walked from the pydantic API models, about
half of them mutated into invalid ones). Each is checked by `find_violations` (what `kvq
validate` runs) and sent to the API server as a dry-run create with strict field validation
(what `kubectl apply` does): both say valid or both say invalid. Every valid one is rendered
for two GPU products on every fallback rung, as `kvq render` does (effective_settings +
render_manifests from the document) and as the operator does (render_rung from the object
the server returned: defaults, uid, ownerReferences, rollout limits); each distinct manifest
is server-side applied as a dry run and must be accepted. The renderer may refuse only with
RenderError.

KVQ_FUZZ_EXAMPLES sets the number of documents (default 2000: about 2 minutes on two idle cores);
KVQ_FUZZ_KNOWN_GAPS=1 also generates the inputs of the known disagreements (KNOWN_GAPS),
which then fail. Each disagreement found has a case below with its minimal document: a
strict xfail while its gap is known, an ordinary regression test once it is fixed.
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import pytest
import yaml
from e2e.devcluster.clients import Kube
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic import DynamicClient

from kvq.api.keys import GROUP, PLURAL, VERSION
from kvq.api.resource import InferenceService
from kvq.api.validation import find_violations, parse_inference_service
from kvq.catalog.engines import load_engine_catalog
from kvq.catalog.gpus import GpuModel, load_gpu_catalog
from kvq.catalog.models import load_model_catalog
from kvq.decide.manifests import render_rung
from kvq.decide.place import RungPlacement
from kvq.decide.types import Catalogs
from kvq.fallback.ladder import Rung, RungState
from kvq.k8s.apply import server_side_apply
from kvq.placement.choice import PoolChoice, PoolVerdict
from kvq.placement.pool import pool_for_gpu
from kvq.render import RenderError, effective_settings, render_manifests
from tests.cluster.operator_support import install_kvq_crd
from tests.fuzz_strategies import KNOWN_GAPS, DocumentStrategies, all_rule_messages

pytestmark = pytest.mark.cluster

EXAMPLES = int(os.environ.get("KVQ_FUZZ_EXAMPLES", "2000"))
EXCLUDED = frozenset() if os.environ.get("KVQ_FUZZ_KNOWN_GAPS") else frozenset(KNOWN_GAPS)
RUNGS = (Rung.REQUESTED, Rung.AUTO, Rung.AWQ)
# Codes of a refusal of the document itself (422 Invalid; 400 for a strict-decoding error).
REFUSED = (400, 422)


@pytest.fixture(scope="module")
def crd(kube: Kube) -> Kube:
    install_kvq_crd(kube)
    return kube


@dataclass
class DryRuns:
    """The API server's verdicts, by dry run: nothing is stored."""

    kube: Kube
    namespace: str
    dynamic: DynamicClient = field(init=False)
    _resources: dict[tuple[str, str], Any] = field(default_factory=dict)
    applied: dict[str, str | None] = field(default_factory=dict)
    """Verdicts by the manifest's canonical JSON: identical manifests are asked once."""

    def __post_init__(self) -> None:
        self.dynamic = DynamicClient(self.kube.api)

    def create(self, doc: dict[str, Any]) -> tuple[dict[str, Any] | None, str | None]:
        """(the object the server would store, None) or (None, the server's refusal)."""
        try:
            stored = self.kube.custom.create_namespaced_custom_object(
                GROUP,
                VERSION,
                self.namespace,
                PLURAL,
                doc,
                dry_run="All",
                field_validation="Strict",
            )
        except ApiException as error:
            if error.status not in REFUSED:
                raise
            return None, _message(error)
        return stored, None

    def apply(self, manifest: dict[str, Any]) -> str | None:
        """None when the server accepts the manifest, else its refusal."""
        key = json.dumps(manifest, sort_keys=True)
        if key not in self.applied:
            self.applied[key] = self._apply(manifest)
        return self.applied[key]

    def _apply(self, manifest: dict[str, Any]) -> str | None:
        kind = (manifest["apiVersion"], manifest["kind"])
        if kind not in self._resources:
            self._resources[kind] = self.dynamic.resources.get(api_version=kind[0], kind=kind[1])
        try:
            # The operator's own apply (its serialization included), as a dry run.
            server_side_apply(
                self.dynamic,
                self._resources[kind],
                manifest,
                self.namespace,
                field_manager="kvq-fuzz",
                force=False,
                dry_run=True,
            )
        except ApiException as error:
            if error.status not in REFUSED and not _refused_patch(error):
                raise
            return _message(error)
        return None


def _refused_patch(error: ApiException) -> bool:
    """Server-side apply answers 500 when the patch itself cannot be typed (a duplicate
    key in a list map): a refusal of the manifest, not a server fault."""
    return error.status == 500 and "failed to create typed patch object" in _message(error)


def _message(error: ApiException) -> str:
    try:
        return str(json.loads(error.body)["message"])
    except (TypeError, ValueError, KeyError):
        return str(error.body)


def offline_manifests(isvc: InferenceService, gpus: list[GpuModel]) -> Iterator[dict[str, Any]]:
    """What `kvq render` prints for each GPU and rung (a RenderError skips that pair)."""
    engines = load_engine_catalog()
    for gpu in gpus:
        for rung in RUNGS:
            try:
                effective = effective_settings(isvc, gpu, rung.value, engines=engines)
                yield from render_manifests(isvc, pool_for_gpu(gpu), effective)
            except RenderError as refusal:
                assert str(refusal), "a RenderError says why"


def operator_manifests(stored: InferenceService, gpu: GpuModel, rung: Rung) -> list[dict[str, Any]]:
    """What the operator applies for one rung on a pool of `gpu` with free GPUs."""
    pool = pool_for_gpu(gpu)
    verdict = PoolVerdict(pool=pool, reasons=(), slots=stored.spec.replicas + 1)
    placement = RungPlacement(
        rung=rung,
        kv_cache_dtype=stored.spec.kv_cache.dtype,
        choice=PoolChoice(chosen=verdict, verdicts=(verdict,)),
        state=RungState(rung=rung, pool=pool.name, compatible=True, runnable=True),
    )
    try:
        rendered = render_rung(
            stored, placement, verdict, key="fuzz", catalogs=_catalogs(), deployment=None
        )
    except RenderError as refusal:
        assert str(refusal), "a RenderError says why"
        return []
    return list(rendered.manifests)


@cache
def _catalogs() -> Catalogs:
    return Catalogs(load_gpu_catalog(), load_engine_catalog(), load_model_catalog())


GPUS = sorted(g.product for g in load_gpu_catalog().all())


@dataclass
class Tally:
    counts: Counter[str] = field(default_factory=Counter)
    rules: Counter[str] = field(default_factory=Counter)

    def summary(self) -> str:
        return ", ".join(f"{key} {value}" for key, value in sorted(self.counts.items()))


def check_document(
    dry: DryRuns, doc: dict[str, Any], gpus: list[GpuModel], rung: Rung, tally: Tally
) -> None:
    """One document: the verdicts agree; a valid one renders what the server accepts."""
    if isinstance(doc.get("metadata"), dict):
        doc["metadata"]["namespace"] = dry.namespace
    violations = find_violations(doc)
    stored, refusal = dry.create(doc)
    shown = yaml.safe_dump(doc, sort_keys=False, allow_unicode=True)
    assert (not violations) == (refusal is None), (
        f"kvq validate and the API server disagree on\n{shown}\n"
        f"kvq validate: {[str(v) for v in violations] or 'valid'}\n"
        f"API server: {refusal or 'valid'}"
    )
    tally.counts["examples"] += 1
    if violations:
        tally.counts["invalid"] += 1
        rules = {v.message for v in violations} & set(all_rule_messages().values())
        tally.rules.update(rules)
        return
    tally.counts["valid"] += 1
    assert stored is not None
    isvc = parse_inference_service(doc)  # as `kvq render` reads the file
    manifests = [
        *offline_manifests(isvc, gpus),
        *operator_manifests(parse_inference_service(stored), gpus[0], rung),  # as the operator
    ]
    if any(m["kind"] == "Deployment" for m in manifests):
        tally.counts["rendered"] += 1
    for manifest in manifests:
        refused = dry.apply(manifest)
        assert refused is None, (
            f"the API server refuses the {manifest['kind']} rendered from\n{shown}\n{refused}"
        )
        tally.counts[f"accepted {manifest['kind']}"] += 1


def test_kvq_validate_agrees_with_the_api_server_and_valid_services_render(
    crd: Kube, namespace: str
) -> None:
    dry = DryRuns(crd, namespace)
    tally = Tally()
    catalog = load_gpu_catalog()
    documents = DocumentStrategies(EXCLUDED).documents()
    gpu_pairs = st.lists(st.sampled_from(GPUS), min_size=2, max_size=2, unique=True)

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(doc=documents, products=gpu_pairs, rung=st.sampled_from(RUNGS))
    def check(doc: dict[str, Any], products: list[str], rung: Rung) -> None:
        gpus = [catalog.lookup(p) for p in products]
        check_document(dry, doc, [g for g in gpus if g is not None], rung, tally)

    began = time.monotonic()
    check()
    elapsed = time.monotonic() - began
    rules = set(all_rule_messages().values())
    seen = rules & set(tally.rules)
    print(
        f"\nfuzz: {tally.summary()}; {len(dry.applied)} distinct manifests; "
        f"{len(seen)}/{len(rules)} CEL rules broken; {elapsed:.0f} s; "
        f"never broken: {sorted(rules - seen)}"
    )
    counts = tally.counts
    assert counts["examples"] >= EXAMPLES * 0.9, "hypothesis ran fewer documents than asked"
    assert 0.3 <= counts["valid"] / counts["examples"] <= 0.7, tally.summary()
    assert counts["rendered"] >= counts["valid"] / 2, "most valid services render somewhere"
    # Each rule broken somewhere: the agreement covers the rules, not only the schema. A
    # floor rather than all: rules added to the API after the strategies were tuned may need
    # a hint (tests/fuzz_strategies.py) before documents reach them.
    assert len(seen) >= 0.9 * len(rules), f"rules never broken: {sorted(rules - seen)}"


# The smallest document of each disagreement the fuzzer found (tests/fuzz_strategies.py), cut
# down by hand, and a few neighbours of each: a strict xfail while its gap is in KNOWN_GAPS,
# an ordinary regression test once it is fixed (all of them today).
CASES: list[tuple[str, str, dict[str, Any]]] = [
    ("lax-types", "replicas as a string", {"spec": {"replicas": "2"}}),
    ("lax-types", "replicas as 2.0", {"spec": {"replicas": 2.0}}),
    ("lax-types", "a boolean for a number", {"spec": {"memory": {"gpuMemoryUtilization": True}}}),
    ("lax-types", "an integer for a number", {"spec": {"memory": {"gpuMemoryUtilization": 1}}}),
    ("lax-types", "1 for a boolean", {"spec": {"kvCache": {"calculateScales": 1}}}),
    ("snake-case-fields", "max_model_len", {"spec": {"memory": {"max_model_len": 4096}}}),
    ("snake-case-fields", "metadata resource_version", {"metadata": {"resource_version": "1"}}),
    ("null-defaults", "replicas null", {"spec": {"replicas": None}}),
    ("null-defaults", "kvCache null", {"spec": {"kvCache": None}}),
    (
        "null-defaults",
        "a null node selector value",
        {"spec": {"placement": {"nodeSelector": {"a": None}}}},
    ),
    ("null-defaults", "a null list item", {"spec": {"placement": {"pools": [None]}}}),
    ("null-defaults", "an unknown field null", {"spec": {"bogus": None}}),
    (
        "int64",
        "minConcurrentSequences 2^63",
        {"spec": {"memory": {"maxModelLen": 4096}, "capacity": {"minConcurrentSequences": 2**63}}},
    ),
    (
        "int64",
        "numParams 2^63",
        {
            "spec": {
                "model": {
                    "architecture": {
                        "numLayers": 2,
                        "numKvHeads": 1,
                        "headDim": 64,
                        "numParams": 2**63,
                    }
                }
            }
        },
    ),
    ("metadata", "a label key with a space", {"metadata": {"labels": {"bad key": "x"}}}),
    ("metadata", "a label value too long", {"metadata": {"labels": {"team": "v" * 64}}}),
    ("metadata", "an unknown metadata field", {"metadata": {"bogus": "x"}}),
    ("metadata", "an annotation key with capitals", {"metadata": {"annotations": {"A.B/c": "x"}}}),
    ("metadata", "a null label value", {"metadata": {"labels": {"team": None}}}),
    (
        "credential-casefold",
        "dotless i in a flag name",
        {"spec": {"engine": {"extraArgs": ["--\u0131-token=x"]}}},
    ),
    (
        "credential-casefold",
        "long s in a flag name",
        {"spec": {"engine": {"extraArgs": ["--\u017fecret=x"]}}},
    ),
    ("render-tolerations", "an empty toleration", {"spec": {"placement": {"tolerations": [{}]}}}),
    (
        "render-tolerations",
        "Exists with a value",
        {
            "spec": {
                "placement": {"tolerations": [{"key": "k", "operator": "Exists", "value": "v"}]}
            }
        },
    ),
    (
        "render-tolerations",
        "tolerationSeconds without NoExecute",
        {"spec": {"placement": {"tolerations": [{"key": "k", "tolerationSeconds": 5}]}}},
    ),
    (
        "render-tolerations",
        "a toleration that renders",
        {
            "spec": {
                "placement": {
                    "tolerations": [
                        {
                            "key": "spot",
                            "operator": "Exists",
                            "effect": "NoExecute",
                            "tolerationSeconds": 60,
                        },
                        {"operator": "Exists"},
                    ]
                }
            }
        },
    ),
    (
        "render-node-selector",
        "a node selector key with a space",
        {"spec": {"placement": {"nodeSelector": {"bad key": "x"}}}},
    ),
    (
        "render-secret-ref",
        "a Secret name with capitals",
        {"spec": {"model": {"tokenSecretRef": {"name": "HF_Token", "key": "token"}}}},
    ),
    (
        "render-secret-ref",
        "a Secret key starting with ..",
        {"spec": {"model": {"tokenSecretRef": {"name": "hf", "key": "..data"}}}},
    ),
    (
        "apply-non-bmp",
        "an emoji in an env value",
        {"spec": {"engine": {"env": [{"name": "GREETING", "value": "\U0001f642"}]}}},
    ),
    (
        "render-pod-settings",
        "a service account name with capitals",
        {"spec": {"pod": {"serviceAccountName": "Engine_SA"}}},
    ),
    (
        "render-pod-settings",
        "a cache claim of size 0",
        {"spec": {"model": {"cache": {"volumeClaim": {"size": "0"}}}}},
    ),
    (
        "render-pod-settings",
        "minDomains with ScheduleAnyway",
        {
            "spec": {
                "placement": {
                    "topologySpreadConstraints": [{"topologyKey": "zone", "minDomains": 2}]
                }
            }
        },
    ),
    (
        "render-pod-settings",
        "In without values",
        {
            "spec": {
                "placement": {
                    "affinity": {
                        "podAffinity": {
                            "requiredDuringSchedulingIgnoredDuringExecution": [
                                {
                                    "topologyKey": "zone",
                                    "labelSelector": {
                                        "matchExpressions": [{"key": "a", "operator": "In"}]
                                    },
                                }
                            ]
                        }
                    }
                }
            }
        },
    ),
    ("rollout-one-zero", "maxSurge 0 alone", {"spec": {"rollout": {"maxSurge": 0}}}),
    ("rollout-one-zero", "maxUnavailable 0 alone", {"spec": {"rollout": {"maxUnavailable": 0}}}),
    (
        "render-duplicate-keys",
        "one pull secret twice",
        {"spec": {"pod": {"imagePullSecrets": [{"name": "regcred"}, {"name": "regcred"}]}}},
    ),
    (
        "render-duplicate-keys",
        "one spread constraint twice",
        {
            "spec": {
                "placement": {
                    "topologySpreadConstraints": [{"topologyKey": "zone"}, {"topologyKey": "zone"}]
                }
            }
        },
    ),
    (
        "tier-duplicate-names",
        "two tiers named a",
        {
            "spec": {
                "tiers": [
                    {"name": "a", "match": {"header": {"name": "x-kvq-tier", "value": "a"}}},
                    {"name": "a", "match": {"header": {"name": "x-kvq-tier", "value": "b"}}},
                ]
            }
        },
    ),
]


def _gap_document(patch: dict[str, Any]) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "InferenceService",
        "metadata": {"name": "gap"},
        "spec": {"model": {"uri": "hf://meta-llama/Meta-Llama-3-8B-Instruct"}},
    }
    return _merged(doc, patch)


def _merged(base: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in patch.items():
        both = isinstance(value, dict) and isinstance(out.get(key), dict)
        out[key] = _merged(out[key], value) if both else value
    return out


def test_every_known_gap_has_its_case() -> None:
    assert set(KNOWN_GAPS) <= {gap for gap, _, _ in CASES}


@pytest.mark.parametrize(
    "patch",
    [
        pytest.param(
            patch,
            id=f"{gap}: {what}",
            marks=[pytest.mark.xfail(strict=True, raises=AssertionError, reason=KNOWN_GAPS[gap])]
            if gap in KNOWN_GAPS
            else [],
        )
        for gap, what, patch in CASES
    ],
)
def test_found_disagreement(crd: Kube, namespace: str, patch: dict[str, Any]) -> None:
    catalog = load_gpu_catalog()
    gpus = [g for g in (catalog.lookup("H100-SXM-80GB"), catalog.lookup("L4")) if g]
    check_document(DryRuns(crd, namespace), _gap_document(patch), gpus, Rung.REQUESTED, Tally())
