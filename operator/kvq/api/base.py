"""The base of every API model: camelCase on the wire, unknown fields refused, CEL rules."""

from __future__ import annotations

from typing import Any, ClassVar, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    GetJsonSchemaHandler,
    ValidationError,
    model_validator,
)
from pydantic.alias_generators import to_camel
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema, InitErrorDetails, PydanticCustomError

from kvq.api.rules import RULE_ERROR, Rule


class KubeModel(BaseModel):
    """A part of the InferenceService API.

    Attribute docstrings become CRD descriptions, so `kubectl explain` reads them.
    """

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        use_attribute_docstrings=True,
        frozen=True,
    )

    kube_rules: ClassVar[tuple[Rule, ...]] = ()

    @model_validator(mode="after")
    def _check_kube_rules(self) -> Self:
        errors = [
            InitErrorDetails(
                type=PydanticCustomError(RULE_ERROR, rule.message),
                loc=_loc(rule.field_path),
                input=self,
            )
            for rule in type(self).kube_rules
            if not rule.check(self)
        ]
        if errors:
            raise ValidationError.from_exception_data(type(self).__name__, errors)
        return self

    @classmethod
    def __get_pydantic_json_schema__(
        cls, schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        json_schema = handler(schema)
        json_schema = handler.resolve_ref_schema(json_schema)
        if cls.kube_rules:
            json_schema["x-kubernetes-validations"] = [r.as_validation() for r in cls.kube_rules]
        return json_schema

    def to_kube(self) -> dict[str, Any]:
        """The object as the API server stores it: camelCase, unset optionals omitted."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


def _loc(field_path: str | None) -> tuple[str, ...]:
    if not field_path:
        return ()
    return tuple(part for part in field_path.split(".") if part)
