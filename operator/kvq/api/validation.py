"""Validate an InferenceService document and report errors the way the API server does.

`kvq validate` and the operator use this; each violation is the field path plus the
message a person reads at `kubectl apply` (the CEL rule's message, or the OpenAPI
schema's wording for types, enums, bounds and unknown fields).

The document is read as the API server reads it: as JSON (no coercion: "5" is not an
integer, 1 is not a boolean; an integer is a number), by its wire names only (camelCase;
`max_model_len` is an unknown field), with null fields dropped first (the server prunes a
null where the schema is not nullable, and none of kvq's is, then applies the default),
and with metadata checked as the server checks ObjectMeta (known fields, label and
annotation syntax).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any, TypeGuard

from pydantic import ValidationError
from pydantic_core import ErrorDetails

from kvq.api.crd import openapi_schema
from kvq.api.keys import API_VERSION, KIND
from kvq.api.names import (
    ANNOTATIONS_MAX_BYTES,
    annotation_key_errors,
    label_key_errors,
    label_value_errors,
)
from kvq.api.resource import InferenceService
from kvq.api.rules import DUPLICATE_ERROR, RULE_ERROR

# The fields of a Kubernetes ObjectMeta (k8s.io/apimachinery metav1.ObjectMeta, JSON names).
OBJECT_META_FIELDS = (
    "name",
    "generateName",
    "namespace",
    "selfLink",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "labels",
    "annotations",
    "ownerReferences",
    "finalizers",
    "managedFields",
)


@dataclass(frozen=True)
class Violation:
    """One reason the document is invalid."""

    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


class InvalidInferenceServiceError(ValueError):
    """Raised with every violation of a document, in the order they were found."""

    def __init__(self, name: str, violations: list[Violation]) -> None:
        self.name = name
        self.violations = violations
        lines = "\n".join(f"* {v}" for v in violations)
        super().__init__(f'InferenceService "{name}" is invalid:\n{lines}')


def parse_inference_service(doc: dict[str, Any]) -> InferenceService:
    """The model of a valid document; `InvalidInferenceServiceError` lists every violation."""
    isvc, violations = _validate(doc)
    if isvc is None:
        name = str((doc.get("metadata") or {}).get("name", "<unnamed>"))
        raise InvalidInferenceServiceError(name, violations)
    return isvc


def find_violations(doc: dict[str, Any]) -> list[Violation]:
    """Every violation in the document; empty when it is valid."""
    return _validate(doc)[1]


def _validate(doc: dict[str, Any]) -> tuple[InferenceService | None, list[Violation]]:
    if doc.get("apiVersion") != API_VERSION or doc.get("kind") != KIND:
        return None, [
            Violation(
                "apiVersion/kind",
                f"expected {API_VERSION} {KIND}, got {doc.get('apiVersion')} {doc.get('kind')}",
            )
        ]
    doc = _without_nulls(doc, _schema())
    metadata = doc.get("metadata")
    violations: list[Violation] = []
    if isinstance(metadata, dict):
        metadata = _decoded_metadata(metadata)
        violations += _metadata_violations(metadata)
        doc = {**doc, "metadata": {k: v for k, v in metadata.items() if k in OBJECT_META_FIELDS}}
    try:
        isvc = InferenceService.model_validate_json(
            json.dumps(doc, default=_jsonable), strict=True, by_alias=True, by_name=False
        )
    except ValidationError as exc:
        violations += [_violation(err) for err in exc.errors(include_url=False)]
        return None, violations
    return (None if violations else isvc), violations


def _jsonable(value: Any) -> Any:
    # A Mapping that is not a dict (a kopf body's view) is an object; anything else YAML
    # gave (a date) is the text it was written as, as kubectl would send it.
    return dict(value) if isinstance(value, Mapping) else str(value)


@cache
def _schema() -> dict[str, Any]:
    return openapi_schema()


def _without_nulls(value: Any, schema: dict[str, Any] | None) -> Any:
    """`value` without the nulls the API server prunes before validating: every null of a
    field the schema knows (none is nullable; a default then applies as if it were absent).
    Unknown fields stay, to be refused; list items stay (a null item is refused)."""
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            sub = _field_schema(schema, key)
            if item is None and sub is not None and not sub.get("nullable"):
                continue
            out[key] = _without_nulls(item, sub)
        return out
    if isinstance(value, list):
        items = schema.get("items") if schema else None
        return [_without_nulls(item, items) for item in value]
    return value


def _field_schema(schema: dict[str, Any] | None, key: str) -> dict[str, Any] | None:
    if schema is None:
        return None
    found = schema.get("properties", {}).get(key)
    if found is None and isinstance(schema.get("additionalProperties"), dict):
        found = schema["additionalProperties"]
    return found if isinstance(found, dict) else None


def _decoded_metadata(metadata: dict[str, Any]) -> dict[str, Any]:
    """metadata as the server's Go decoding leaves it: a null field is its zero value (as
    if absent), a null label or annotation value an empty string."""
    out = {k: v for k, v in metadata.items() if v is not None}
    for key in ("labels", "annotations"):
        if isinstance(out.get(key), dict):
            out[key] = {k: "" if v is None else v for k, v in out[key].items()}
    return out


def _metadata_violations(metadata: dict[str, Any]) -> list[Violation]:
    """The server's ObjectMeta checks of what a person writes: known fields, label and
    annotation syntax (names are the CRD's rule; other fields are left to the server)."""
    found = [
        Violation(f"metadata.{key}", f'unknown field "metadata.{key}"')
        for key in metadata
        if key not in OBJECT_META_FIELDS
    ]
    labels = metadata.get("labels")
    if _is_text_map(labels):
        for key, value in labels.items():
            found += _invalid("metadata.labels", key, label_key_errors(key))
            found += _invalid("metadata.labels", value, label_value_errors(value))
    annotations = metadata.get("annotations")
    if _is_text_map(annotations):
        for key in annotations:
            found += _invalid("metadata.annotations", key, annotation_key_errors(key))
        size = sum(len(k.encode()) + len(v.encode()) for k, v in annotations.items())
        if size > ANNOTATIONS_MAX_BYTES:
            found.append(
                Violation(
                    "metadata.annotations",
                    f"Too long: may not be more than {ANNOTATIONS_MAX_BYTES} bytes",
                )
            )
    return found


def _is_text_map(value: Any) -> TypeGuard[dict[str, str]]:
    return isinstance(value, dict) and all(isinstance(v, str) for v in value.values())


def _invalid(field: str, value: str, messages: list[str]) -> list[Violation]:
    return [Violation(field, f'Invalid value: "{value}": {message}') for message in messages]


def _violation(err: ErrorDetails) -> Violation:
    path = _path(err["loc"])
    kind = err["type"]
    value = err.get("input")
    ctx = err.get("ctx") or {}
    if kind == RULE_ERROR:
        return Violation(path, err["msg"])
    if kind == DUPLICATE_ERROR:
        return Violation(f"{path}[{ctx['index']}]", err["msg"])
    if kind == "missing":
        return Violation(path, "Required value")
    if kind == "extra_forbidden":
        return Violation(path, f'unknown field "{path}"')
    if kind == "literal_error":
        allowed = ", ".join(f'"{v}"' for v in re.findall(r"'([^']*)'", str(ctx["expected"])))
        return Violation(path, f'Unsupported value: "{value}": supported values: {allowed}')
    bounds = {
        "greater_than_equal": ("ge", "greater than or equal to"),
        "greater_than": ("gt", "greater than"),
        "less_than_equal": ("le", "less than or equal to"),
        "less_than": ("lt", "less than"),
    }
    if kind in bounds:
        key, words = bounds[kind]
        return Violation(path, f"Invalid value: {value}: should be {words} {ctx[key]}")
    if kind == "string_too_long":
        return Violation(path, f"Too long: may not be more than {ctx['max_length']} bytes")
    if kind == "string_too_short":
        return Violation(
            path, f'Invalid value: "{value}": should be at least {ctx["min_length"]} chars long'
        )
    if kind == "too_long":
        return Violation(
            path, f"Too many: {ctx['actual_length']}: must have at most {ctx['max_length']} items"
        )
    if kind == "too_short":
        return Violation(
            path,
            f"Invalid value: {ctx['actual_length']}: "
            f"should have at least {ctx['min_length']} items",
        )
    if kind == "string_pattern_mismatch":
        return Violation(path, f"Invalid value: \"{value}\": should match '{ctx['pattern']}'")
    type_names = {
        "int": "integer",
        "float": "number",
        "string": "string",
        "bool": "boolean",
        "dict": "object",
        "model": "object",
        "list": "array",
    }
    for prefix, type_name in type_names.items():
        if kind.startswith(prefix + "_"):
            return Violation(
                path, f"Invalid value: {_json_type(value)}: must be of type {type_name}"
            )
    return Violation(path, err["msg"])


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return '"boolean"'
    if isinstance(value, int | float):
        return '"number"' if isinstance(value, float) else '"integer"'
    if isinstance(value, str):
        return '"string"'
    if isinstance(value, list):
        return '"array"'
    if isinstance(value, dict):
        return '"object"'
    return '"null"'


def _path(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif not _is_internal(part):
            out += f".{part}" if out else part
    return out or "<root>"


def _is_internal(part: str) -> bool:
    # pydantic adds the validator or union branch to a location, e.g. "function-after[...]".
    return "[" in part or part in ("int", "float", "str", "bool", "list", "dict")
