"""Kubernetes name and label syntax, as CEL rules for the CRD with their Python twins.

What the API server checks on the objects kvq renders (a Deployment, a PVC, a Job) is
checked on the InferenceService already, so a service the CRD accepts never renders a
manifest the server refuses. The regular expressions are written once for both engines:
ASCII classes only, no backslashes (CEL string literals would read them as escapes), and
Python matches them with `fullmatch` (RE2's `$` is the end of the text, Python's is not).

`metadata` is checked by the API server's own ObjectMeta validation, not by CEL:
`label_key_errors` and the other `*_errors` functions port those checks with the server's
wording (k8s.io/apimachinery/pkg/util/validation), for `kvq validate`.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import Field

from kvq.api.rules import FieldRule

DNS1123_LABEL_RE = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS1123_SUBDOMAIN_RE = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
# [prefix/]name: the prefix a DNS subdomain (at most 253 characters, LONG_PREFIX_RE), the
# name at most 63 characters.
LABEL_KEY_RE = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
LONG_PREFIX_RE = r"^[^/]{254,}/"
# Annotation keys are label keys once lower-cased: the prefix may have capitals.
ANNOTATION_KEY_RE = (
    r"^([A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?([.][A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
LABEL_VALUE_RE = r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$"
CONFIG_MAP_KEY_RE = r"^[-._a-zA-Z0-9]+$"
INTEGER_RE = r"^[0-9]+$"

SUBDOMAIN_WORDS = "a DNS subdomain: lowercase letters, digits, '-' and '.', starting and ending "
SUBDOMAIN_WORDS += "with a letter or digit, at most 253 characters"
LABEL_KEY_WORDS = (
    "[prefix/]name, the name at most 63 letters, digits, '-', '_' or '.' starting and ending "
    "with a letter or digit, the prefix a DNS subdomain"
)
LABEL_VALUE_WORDS = (
    "empty or at most 63 letters, digits, '-', '_' or '.' starting and ending with a letter "
    "or digit"
)


def _full(pattern: str, value: str) -> bool:
    return re.fullmatch(pattern, value) is not None


# The syntax only: lengths are the fields' maxLength (and a label key's name part, its regex).
def is_dns_label(value: str) -> bool:
    return _full(DNS1123_LABEL_RE, value)


def is_dns_subdomain(value: str) -> bool:
    return _full(DNS1123_SUBDOMAIN_RE, value)


def is_label_key(key: str) -> bool:
    return _full(LABEL_KEY_RE, key) and re.match(LONG_PREFIX_RE, key) is None


def is_annotation_key(key: str) -> bool:
    return _full(ANNOTATION_KEY_RE, key) and re.match(LONG_PREFIX_RE, key) is None


def is_label_value(value: str) -> bool:
    return _full(LABEL_VALUE_RE, value)


def is_config_map_key(key: str) -> bool:
    return _full(CONFIG_MAP_KEY_RE, key) and not _chdir(key)


def _chdir(key: str) -> bool:
    return key == "." or key.startswith("..")


def _are_labels(labels: dict[str, str]) -> bool:
    return all(is_label_key(k) and is_label_value(v) for k, v in labels.items())


_LABEL_KEY_CEL = f"%s.matches('{LABEL_KEY_RE}') && !%s.matches('{LONG_PREFIX_RE}')"


def dns_subdomain(what: str) -> FieldRule:
    """A name of an object the engine pod refers to (a Secret, a ServiceAccount, ...)."""
    return FieldRule(
        cel=f"self.matches('{DNS1123_SUBDOMAIN_RE}')",
        message=f"{what} must be {SUBDOMAIN_WORDS}",
        check=is_dns_subdomain,
    )


def dns_subdomain_items(what: str) -> FieldRule:
    """A list of object names (node names)."""
    return FieldRule(
        cel=f"self.all(n, n.matches('{DNS1123_SUBDOMAIN_RE}'))",
        message=f"{what} must be {SUBDOMAIN_WORDS}",
        check=lambda items: all(is_dns_subdomain(n) for n in items),
    )


def dns_label_items(what: str) -> FieldRule:
    """A list of DNS labels (namespace names)."""
    return FieldRule(
        cel=f"self.all(n, n.matches('{DNS1123_LABEL_RE}'))",
        message=f"{what} must be DNS labels: lowercase letters, digits and '-', starting and "
        "ending with a letter or digit, at most 63 characters",
        check=lambda items: all(is_dns_label(n) for n in items),
    )


def label_key(what: str) -> FieldRule:
    """A label key (a topology key, a toleration's taint key); empty is left to its model."""
    return FieldRule(
        cel="self == '' || (" + _LABEL_KEY_CEL % ("self", "self") + ")",
        message=f"{what} must be a label key: {LABEL_KEY_WORDS}",
        check=lambda v: v == "" or is_label_key(v),
    )


def label_value(what: str) -> FieldRule:
    return FieldRule(
        cel=f"self.matches('{LABEL_VALUE_RE}')",
        message=f"{what} must be a label value: {LABEL_VALUE_WORDS}",
        check=is_label_value,
    )


def label_values(what: str) -> FieldRule:
    return FieldRule(
        cel=f"self.all(v, v.matches('{LABEL_VALUE_RE}'))",
        message=f"{what} must be label values: {LABEL_VALUE_WORDS}",
        check=lambda items: all(is_label_value(v) for v in items),
    )


def label_map(what: str) -> FieldRule:
    """A map of labels (pod labels, a node selector, matchLabels)."""
    return FieldRule(
        cel="self.all(k, "
        + _LABEL_KEY_CEL % ("k", "k")
        + f" && self[k].matches('{LABEL_VALUE_RE}'))",
        message=f"{what} must be labels: keys {LABEL_KEY_WORDS}; values {LABEL_VALUE_WORDS}",
        check=_are_labels,
    )


def annotation_keys(what: str) -> FieldRule:
    return FieldRule(
        cel=f"self.all(k, k.matches('{ANNOTATION_KEY_RE}') && !k.matches('{LONG_PREFIX_RE}'))",
        message=f"{what} keys must be {LABEL_KEY_WORDS} (the prefix may have capitals)",
        check=lambda annotations: all(is_annotation_key(k) for k in annotations),
    )


def config_map_key(what: str) -> FieldRule:
    """A key of a Secret or ConfigMap (it becomes a file name when mounted)."""
    return FieldRule(
        cel=f"self.matches('{CONFIG_MAP_KEY_RE}') && self != '.' && !self.startsWith('..')",
        message=f"{what} must be letters, digits, '-', '_' or '.', not '.' and not "
        "starting with '..'",
        check=is_config_map_key,
    )


# The name of a Secret or ConfigMap in the InferenceService's namespace.
ObjectName = Annotated[
    str, Field(min_length=1, max_length=253), dns_subdomain("the name of a Secret or ConfigMap")
]
# A key of a Secret or ConfigMap.
ObjectKey = Annotated[
    str, Field(min_length=1, max_length=253), config_map_key("a Secret or ConfigMap key")
]


# --- ObjectMeta, as the API server words it -----------------------------------------------

_QNAME_FMT = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
_QNAME_MSG = (
    "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with "
    "an alphanumeric character"
)
_SUBDOMAIN_FMT = "[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
_SUBDOMAIN_MSG = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' "
    "or '.', and must start and end with an alphanumeric character"
)
_LABEL_VALUE_MSG = (
    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' "
    "or '.', and must start and end with an alphanumeric character"
)
ANNOTATIONS_MAX_BYTES = 256 * 1024


def _regex_error(message: str, fmt: str, *examples: str) -> str:
    shown = " or ".join(f"'{e}', " for e in examples)
    return f"{message} (e.g. {shown}regex used for validation is '{fmt}')"


def _subdomain_errors(value: str) -> list[str]:
    errors = []
    if len(value.encode()) > 253:
        errors.append("must be no more than 253 characters")
    if not _full(DNS1123_SUBDOMAIN_RE, value):
        errors.append(_regex_error(_SUBDOMAIN_MSG, _SUBDOMAIN_FMT, "example.com"))
    return errors


def label_key_errors(key: str) -> list[str]:
    """What the API server says of a label key (IsQualifiedName); empty when valid."""
    parts = key.split("/")
    errors: list[str] = []
    if len(parts) > 2:
        return [
            "a qualified name "
            + _regex_error(_QNAME_MSG, _QNAME_FMT, "MyName", "my.name", "123-abc")
            + " with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"
        ]
    name = parts[-1]
    if len(parts) == 2:
        if not parts[0]:
            errors.append("prefix part must be non-empty")
        else:
            errors += [f"prefix part {e}" for e in _subdomain_errors(parts[0])]
    if not name:
        errors.append("name part must be non-empty")
    elif len(name.encode()) > 63:
        errors.append("name part must be no more than 63 characters")
    if not _full(f"^{_QNAME_FMT}$", name):
        errors.append(
            "name part " + _regex_error(_QNAME_MSG, _QNAME_FMT, "MyName", "my.name", "123-abc")
        )
    return errors


def label_value_errors(value: str) -> list[str]:
    """What the API server says of a label value (IsValidLabelValue); empty when valid."""
    errors = []
    if len(value.encode()) > 63:
        errors.append("must be no more than 63 characters")
    if not _full(f"^({_QNAME_FMT})?$", value):
        errors.append(
            _regex_error(_LABEL_VALUE_MSG, f"({_QNAME_FMT})?", "MyValue", "my_value", "12345")
        )
    return errors


def annotation_key_errors(key: str) -> list[str]:
    """Annotation keys are checked as label keys once lower-cased, as Go lower-cases."""
    return label_key_errors(go_lower(key))


def go_lower(text: str) -> str:
    """strings.ToLower: one character for one (Python's İ.lower() is two)."""
    return "".join("i" if c == "\u0130" else c.lower() for c in text)
