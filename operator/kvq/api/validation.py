"""Validate an InferenceService document and report errors the way the API server does.

`kvq validate` and the operator use this; each violation is the field path plus the
message a person reads at `kubectl apply` (the CEL rule's message, or the OpenAPI
schema's wording for types, enums, bounds and unknown fields).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError
from pydantic_core import ErrorDetails

from kvq.api.models import API_VERSION, KIND, InferenceService
from kvq.api.rules import DUPLICATE_ERROR, RULE_ERROR


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
    violations = find_violations(doc)
    name = str((doc.get("metadata") or {}).get("name", "<unnamed>"))
    if violations:
        raise InvalidInferenceServiceError(name, violations)
    return InferenceService.model_validate(doc)


def find_violations(doc: dict[str, Any]) -> list[Violation]:
    """Every violation in the document; empty when it is valid."""
    if doc.get("apiVersion") != API_VERSION or doc.get("kind") != KIND:
        return [
            Violation(
                "apiVersion/kind",
                f"expected {API_VERSION} {KIND}, got {doc.get('apiVersion')} {doc.get('kind')}",
            )
        ]
    try:
        InferenceService.model_validate(doc)
    except ValidationError as exc:
        return [_violation(err) for err in exc.errors(include_url=False)]
    return []


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
