"""The ladder key: what decides whether the engine accepts a KV-cache dtype.

The ladder's history binds only the spec it was learned on. Keyed to the spec's generation,
any edit (replicas through `kubectl scale`, an autoscaler) would forget a refusal and
re-deploy the dtype that just crashed; keyed to these fields, only a change that could
change the engine's answer starts the ladder afresh.
"""

from __future__ import annotations

import hashlib
import json

from kvq.api.spec import InferenceServiceSpec

KEY_LENGTH = 12


def ladder_key(spec: InferenceServiceSpec) -> str:
    """A short hash of the model, AWQ model, KV cache, engine image/version/args/env, GPUs
    per replica and context length. The pool is not in it: each move records its pool."""
    model = spec.model
    inputs = {
        "model": [model.uri, model.revision, model.awq.uri if model.awq else None],
        "kvCache": spec.kv_cache.to_kube(),
        "engine": spec.engine.to_kube(),
        "gpusPerReplica": spec.placement.gpus_per_replica,
        "maxModelLen": spec.memory.max_model_len,
    }
    canonical = json.dumps(inputs, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:KEY_LENGTH]
