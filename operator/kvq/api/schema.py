"""Turn pydantic's JSON Schema into a Kubernetes structural schema (OpenAPI v3.0 dialect).

What changes: `$ref`s inlined, titles dropped, `Optional` unions collapsed to the
non-null branch, JSON-Schema-2020 exclusive bounds rewritten as OpenAPI 3.0 booleans,
`const` written as a one-value enum.
"""

from __future__ import annotations

from typing import Any

JsonDict = dict[str, Any]

_DROP = ("title",)


def structural_schema(schema: JsonDict, *, defaults: bool = True) -> JsonDict:
    """The structural form of a pydantic model's `model_json_schema()`.

    With `defaults`, the API server fills in pydantic's defaults, so what `kubectl get`
    shows is what kvq uses; status schemas pass False (only kvq writes status).
    """
    defs: JsonDict = schema.get("$defs", {})
    return _convert({k: v for k, v in schema.items() if k != "$defs"}, defs, defaults)


def _convert(node: JsonDict, defs: JsonDict, defaults: bool) -> JsonDict:
    node = _inline(node, defs)
    node = _collapse_optional(node, defs)
    out: JsonDict = {}
    for key, value in node.items():
        if key in _DROP or (key == "default" and (value is None or not defaults)):
            continue
        if key == "additionalProperties" and value is False:
            continue  # not allowed beside properties; strict field validation refuses extras
        if key == "properties":
            out[key] = {name: _convert(sub, defs, defaults) for name, sub in value.items()}
        elif key in ("items", "additionalProperties") and isinstance(value, dict):
            out[key] = _convert(value, defs, defaults)
        elif key == "const":
            out["enum"] = [value]
        elif key == "exclusiveMinimum":
            out["minimum"], out["exclusiveMinimum"] = value, True
        elif key == "exclusiveMaximum":
            out["maximum"], out["exclusiveMaximum"] = value, True
        else:
            out[key] = value
    if "enum" in out and "type" not in out:
        out["type"] = _enum_type(out["enum"])
    if (
        out.get("type") == "object"
        and "properties" not in out
        and "additionalProperties" not in out
    ):
        out["x-kubernetes-preserve-unknown-fields"] = True
    return out


def _inline(node: JsonDict, defs: JsonDict) -> JsonDict:
    """Replace a `$ref` (or a one-item allOf around one) by its definition, keeping siblings."""
    if "allOf" in node and len(node["allOf"]) == 1:
        node = {**{k: v for k, v in node.items() if k != "allOf"}, **node["allOf"][0]}
    if "$ref" in node:
        target = defs[node["$ref"].removeprefix("#/$defs/")]
        siblings = {k: v for k, v in node.items() if k != "$ref"}
        node = {**target, **siblings}
        if "x-kubernetes-validations" in target and "x-kubernetes-validations" in siblings:
            node["x-kubernetes-validations"] = (
                target["x-kubernetes-validations"] + siblings["x-kubernetes-validations"]
            )
    return node


def _collapse_optional(node: JsonDict, defs: JsonDict) -> JsonDict:
    """`X | None` -> X: kvq never stores null, and the server prunes nulls it receives."""
    branches = node.get("anyOf")
    if not branches:
        return node
    non_null = [b for b in branches if b.get("type") != "null"]
    if len(non_null) != 1:
        raise ValueError(f"unions other than Optional are not structural: {node}")
    merged = {k: v for k, v in node.items() if k != "anyOf"}
    inner = _inline(non_null[0], defs)
    return {**inner, **merged}


def _enum_type(values: list[Any]) -> str:
    if all(isinstance(v, bool) for v in values):
        return "boolean"
    if all(isinstance(v, int) for v in values):
        return "integer"
    return "string"
