"""The environment of kvq's containers: plain values, and values read from Secrets and
ConfigMaps by reference only (kvq never sees them)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from kvq.api.base import KubeModel
from kvq.api.credentials import CREDENTIAL_ENV_RE, is_credential_env
from kvq.api.names import ObjectKey, ObjectName
from kvq.api.rules import FieldRule, Rule, exactly_one


class KeySelector(KubeModel):
    """One key of a Secret or ConfigMap in the InferenceService's namespace."""

    name: ObjectName
    """Name of the Secret or ConfigMap."""
    key: ObjectKey
    """The key whose value becomes the variable's value."""
    optional: bool | None = None
    """Start the pod even if the object or key is missing (the variable is then unset)."""


class EnvVarSource(KubeModel):
    """Where a variable's value comes from: a Secret key or a ConfigMap key."""

    kube_rules = (
        Rule(
            cel="(has(self.secretKeyRef) ? 1 : 0) + (has(self.configMapKeyRef) ? 1 : 0) == 1",
            message="valueFrom needs exactly one of secretKeyRef and configMapKeyRef",
            check=lambda s: exactly_one(
                s.secret_key_ref is not None, s.config_map_key_ref is not None
            ),
        ),
    )

    secret_key_ref: KeySelector | None = None
    """A key of a Secret (credentials: HF_TOKEN, AWS_SECRET_ACCESS_KEY, ...)."""
    config_map_key_ref: KeySelector | None = None
    """A key of a ConfigMap (settings: HF_ENDPOINT, AWS_REGION, ...)."""


class EnvFromRef(KubeModel):
    """A Secret or ConfigMap in the InferenceService's namespace."""

    name: ObjectName
    """Name of the Secret or ConfigMap."""
    optional: bool | None = None
    """Start the pod even if the object is missing."""


class EnvFromSource(KubeModel):
    """Every key of a Secret or ConfigMap as an environment variable."""

    kube_rules = (
        Rule(
            cel="(has(self.secretRef) ? 1 : 0) + (has(self.configMapRef) ? 1 : 0) == 1",
            message="envFrom needs exactly one of secretRef and configMapRef",
            check=lambda s: exactly_one(s.secret_ref is not None, s.config_map_ref is not None),
        ),
    )

    secret_ref: EnvFromRef | None = None
    """A Secret whose keys become variables (e.g. AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY)."""
    config_map_ref: EnvFromRef | None = None
    """A ConfigMap whose keys become variables."""
    prefix: Annotated[str | None, Field(max_length=64, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")] = None
    """Prepended to every key's name."""


class EnvVar(KubeModel):
    """An environment variable: a plain value, or a value read from a Secret or ConfigMap."""

    kube_rules = (
        Rule(
            cel="!has(self.value) || !has(self.valueFrom)",
            message="set value or valueFrom, not both",
            check=lambda e: e.value is None or e.value_from is None,
        ),
    )

    name: Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]
    """Variable name."""
    value: Annotated[str | None, Field(max_length=4096)] = None
    """Plain value. Never a credential: variables named like one (HF_TOKEN, *_KEY,
    *_SECRET, ...) must use valueFrom."""
    value_from: EnvVarSource | None = None
    """The value of a Secret or ConfigMap key, read by the kubelet (kvq never sees it)."""


def _no_credential_env(env: list[EnvVar]) -> bool:
    return not any(is_credential_env(e.name) and e.value is not None for e in env)


EnvList = Annotated[
    list[EnvVar],
    Field(max_length=64),
    FieldRule(
        cel=f"self.all(e, !e.name.matches('{CREDENTIAL_ENV_RE}') || !has(e.value))",
        message="env must not carry credentials as plain values (HF_TOKEN, *_TOKEN, *_KEY, "
        "*_SECRET, *_PASSWORD): use valueFrom.secretKeyRef or envFrom",
        check=_no_credential_env,
    ),
]

EnvFromList = Annotated[list[EnvFromSource], Field(max_length=16)]
