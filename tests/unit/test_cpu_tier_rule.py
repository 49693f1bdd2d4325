"""The CRD refuses a CPU tier the engine version cannot keep, as `kvq validate` does.

The rule is built from the engine catalog: the CEL (run here by cel-python, as the API
server would) and its Python twin must give the same verdict for every way a spec names
its engine (version field, image tag with suffixes, registries with ports, digests, no
tag, kvq's default image).
"""

from __future__ import annotations

from typing import Any

import pytest

from kvq.api.cpu_tier import refused_minors
from kvq.api.crd import openapi_schema
from kvq.api.validation import find_violations
from tests.unit.cel_eval import apply_defaults, failed_rules

FIELD = "spec.memory.swapSpaceGiB"


def document(engine: dict[str, str], memory: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "kvq.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": "llama", "namespace": "team-a"},
        "spec": {
            "model": {"uri": "hf://meta-llama/Meta-Llama-3-8B-Instruct"},
            "engine": engine,
            "memory": memory,
        },
    }


@pytest.mark.parametrize(
    ("engine", "memory", "refused"),
    [
        ({}, {"swapSpaceGiB": 8}, False),  # the default image, 0.26: native offloading
        ({}, {"swapSpaceGiB": 8, "offloadBackend": "lmcache"}, True),  # 0.26: MP mode
        ({}, {"swapSpaceGiB": 0, "offloadBackend": "lmcache"}, False),  # no tier asked
        ({"image": "vllm/vllm-openai:v0.11.0"}, {"swapSpaceGiB": 4}, True),
        ({"image": "vllm/vllm-openai:v0.11.2"}, {}, False),  # unset: nothing asked
        ({"image": "vllm/vllm-openai:v0.12.0"}, {"swapSpaceGiB": 4}, True),
        (
            {"image": "vllm/vllm-openai:v0.12.0"},
            {"swapSpaceGiB": 4, "offloadBackend": "lmcache"},
            False,
        ),
        ({"image": "registry:5000/team/vllm:v0.13.0-cu128"}, {"swapSpaceGiB": 1}, True),
        ({"image": "vllm/vllm-openai:v0.13.1@sha256:" + "a" * 64}, {"swapSpaceGiB": 1}, True),
        ({"image": "vllm/vllm-openai:0.14.0"}, {"swapSpaceGiB": 1}, False),
        ({"image": "vllm/vllm-openai:v0.130.0"}, {"swapSpaceGiB": 1}, False),  # not 0.13
        (
            {"image": "vllm/vllm-openai:v0.10.2"},
            {"swapSpaceGiB": 1, "offloadBackend": "lmcache"},
            False,
        ),  # V0 swap: the backend does not matter
        (
            {"image": "vllm/vllm-openai:v0.23.0"},
            {"swapSpaceGiB": 1, "offloadBackend": "lmcache"},
            True,
        ),
        ({"image": "vllm/vllm-openai:latest"}, {"swapSpaceGiB": 1}, False),  # version unknown
        ({"image": "vllm/vllm-openai:v0.26.0", "version": "0.12.1"}, {"swapSpaceGiB": 1}, True),
        ({"image": "vllm/vllm-openai:v0.12.0", "version": "v0.26"}, {"swapSpaceGiB": 1}, False),
    ],
)
def test_cel_and_kvq_validate_agree_on_the_cpu_tier(
    engine: dict[str, str], memory: dict[str, Any], refused: bool
) -> None:
    doc = document(engine, memory)
    cel = [f for f in failed_rules(apply_defaults(doc, openapi_schema()), openapi_schema())]
    python = [(v.field, v.message) for v in find_violations(doc)]
    expected = 1 if refused else 0
    assert [f for f, _ in cel] == [FIELD] * expected
    assert [f for f, _ in python] == [FIELD] * expected
    assert [m for _, m in cel] == [m for _, m in python]


def test_the_refused_versions_come_from_the_catalog() -> None:
    assert refused_minors("native") == ((0, 11), (0, 12), (0, 13))
    assert refused_minors("lmcache")[:2] == ((0, 11), (0, 23))
    assert refused_minors("lmcache")[-1] == (0, 33)
