"""Evaluate a CRD's CEL rules offline, as the API server would (defaults first).

Used to hold the CEL rules and their Python twins to the same verdicts without a
cluster; tests/cluster checks the same cases against a real API server.
"""

from __future__ import annotations

from typing import Any

import celpy

Schema = dict[str, Any]

_ENV = celpy.Environment()


def apply_defaults(value: Any, schema: Schema) -> Any:
    """Structural defaulting: fill absent properties that have a default, recursively."""
    if isinstance(value, dict) and schema.get("type") == "object":
        out = dict(value)
        for name, sub in schema.get("properties", {}).items():
            if name not in out and "default" in sub:
                out[name] = sub["default"]
            if name in out:
                out[name] = apply_defaults(out[name], sub)
        return out
    if isinstance(value, list) and "items" in schema:
        return [apply_defaults(v, schema["items"]) for v in value]
    return value


def _typed(value: Any, schema: Schema) -> Any:
    # The server types CEL values by the schema: a `number` field written as 1 is a double.
    if schema.get("type") == "number" and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, dict):
        props = schema.get("properties", {})
        return {k: _typed(v, props.get(k, {})) for k, v in value.items()}
    if isinstance(value, list):
        return [_typed(v, schema.get("items", {})) for v in value]
    return value


def failed_rules(value: Any, schema: Schema, path: str = "") -> list[tuple[str, str]]:
    """(field path, message) of every CEL rule that fails on `value`."""
    failures: list[tuple[str, str]] = []
    for rule in schema.get("x-kubernetes-validations", []):
        program = _ENV.program(_ENV.compile(rule["rule"]))
        result = program.evaluate({"self": celpy.json_to_cel(_typed(value, schema))})
        if result is not True and not (isinstance(result, celpy.celtypes.BoolType) and result):
            failures.append((path + rule.get("fieldPath", "") or "<root>", rule["message"]))
    if isinstance(value, dict):
        for name, sub in schema.get("properties", {}).items():
            if name in value:
                child = f"{path}.{name}" if path else name
                failures += failed_rules(value[name], sub, child)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            failures += failed_rules(item, schema.get("items", {}), f"{path}[{i}]")
    return failures
