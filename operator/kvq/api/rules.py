"""Validation rules written once, enforced twice: as CEL in the CRD and in pydantic.

The API server runs the CEL expression at `kubectl apply`; the operator and
`kvq validate` run the Python check. Both report the same message at the same
path, and tests hold the two implementations to the same verdicts.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic import GetCoreSchemaHandler, GetJsonSchemaHandler
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema, PydanticCustomError, core_schema

RULE_ERROR = "kube_rule"
DUPLICATE_ERROR = "kube_duplicate"


def exactly_one(*present: bool) -> bool:
    """Exactly one of several optional fields is set (a Kubernetes one-of)."""
    return sum(present) == 1


@dataclass(frozen=True)
class Rule:
    """One rule: a CEL expression, the same check in Python, and the message a person reads.

    `field_path` (e.g. ".rungs") points the error at a child field of the object
    the rule sits on, as the CRD's `fieldPath` does.
    """

    cel: str
    message: str
    check: Callable[[Any], bool] = field(compare=False)
    field_path: str | None = None

    def as_validation(self) -> dict[str, str]:
        rule = {"rule": self.cel, "message": self.message}
        if self.field_path:
            rule["fieldPath"] = self.field_path
        return rule


@dataclass(frozen=True)
class FieldRule:
    """A Rule on a single scalar or list field, used as an `Annotated` marker."""

    cel: str
    message: str
    check: Callable[[Any], bool] = field(compare=False)

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> CoreSchema:
        def validate(value: Any) -> Any:
            if value is not None and not self.check(value):
                raise PydanticCustomError(RULE_ERROR, self.message)
            return value

        return core_schema.no_info_after_validator_function(validate, handler(source))

    def __get_pydantic_json_schema__(
        self, schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        json_schema = handler(schema)
        rules = json_schema.setdefault("x-kubernetes-validations", [])
        rules.append({"rule": self.cel, "message": self.message})
        return json_schema


@dataclass(frozen=True)
class UniqueItems:
    """Python side of `x-kubernetes-list-type: set`: the server refuses repeated items."""

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> CoreSchema:
        def validate(items: list[Any]) -> list[Any]:
            seen: set[Any] = set()
            for index, item in enumerate(items):
                if item in seen:
                    raise PydanticCustomError(
                        DUPLICATE_ERROR, f'Duplicate value: "{item}"', {"index": index}
                    )
                seen.add(item)
            return items

        return core_schema.no_info_after_validator_function(validate, handler(source))


@dataclass(frozen=True)
class ListMapKeys:
    """`x-kubernetes-list-type: map`: items are keyed by these fields (wire names); the server
    refuses two items with the same key (and server-side apply cannot merge them), and so
    does this check, with the server's words."""

    keys: tuple[str, ...]

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> CoreSchema:
        def validate(items: list[Any]) -> list[Any]:
            seen: set[tuple[Any, ...]] = set()
            for index, item in enumerate(items):
                key = tuple(_wire_value(item, name) for name in self.keys)
                if key in seen:
                    shown = json.dumps(
                        dict(zip(self.keys, key, strict=True)),
                        sort_keys=True,
                        separators=(",", ":"),
                        ensure_ascii=False,
                    )
                    raise PydanticCustomError(
                        DUPLICATE_ERROR, f"Duplicate value: {shown}", {"index": index}
                    )
                seen.add(key)
            return items

        return core_schema.no_info_after_validator_function(validate, handler(source))

    def __get_pydantic_json_schema__(
        self, schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        json_schema = handler(schema)
        json_schema["x-kubernetes-list-type"] = "map"
        json_schema["x-kubernetes-list-map-keys"] = list(self.keys)
        return json_schema


def _wire_value(item: Any, wire: str) -> Any:
    """The value of the field whose wire name is `wire` (items are validated models)."""
    for name, info in type(item).model_fields.items():
        if (info.alias or name) == wire:
            return getattr(item, name)
    raise KeyError(wire)
