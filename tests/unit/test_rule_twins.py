"""Every CEL rule on a field and its Python twin give the same verdict on any value.

The CEL runs in cel-python, whose `matches` is RE2 as in the API server; values are drawn
widely (any character, emoji and the letters Python's re and RE2 fold differently), near
each rule's own regular expression, and from a list of known troublemakers.
"""

from __future__ import annotations

import re
import types
from functools import cache
from typing import Annotated, Any, Union, get_args, get_origin

import celpy
import pytest
import re2
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from kvq.api.credentials import (
    CREDENTIAL_ENV_RE,
    CREDENTIAL_FLAG_RE,
    is_credential_env,
    is_credential_flag,
)
from kvq.api.resource import InferenceService
from kvq.api.rules import FieldRule

_ENV = celpy.Environment()
_TROUBLE = [
    "",
    ".",
    "..",
    "..data",
    "a/b",
    "a/b/c",
    "/a",
    "a/",
    "-a",
    "a-",
    "a\n",
    "a b",
    "A",
    "x" * 63,
    "x" * 64,
    "p" * 253 + "/x",
    "p" * 254 + "/x",
    "example.com/Name",
    "Example.com/name",
    "\u0130",
    "\u0131",
    "\u212a",
    "\u017f",
    "--\u0131-token=x",
    "--\u0130-key=x",
    "--\u017fecret=x",
    "--\u212aey",
    "--hf-token=x",
    "--tokenizer",
    "0",
    "0.0Gi",
    "16Gi",
    "12",
    "-5",
    "\U0001f642",
]
Site = tuple[str, FieldRule, type]


def _field_rules() -> list[Site]:
    """(model.field, rule, the scalar, list or dict type it checks) of every field rule on
    strings, numbers and their lists and maps (rules on model lists are the corpus's)."""
    found: list[Site] = []
    seen: set[type[BaseModel]] = set()

    def walk(model: type[BaseModel]) -> None:
        if model in seen:
            return
        seen.add(model)
        for name, info in model.model_fields.items():
            base = _base(info)
            for item in _metadata(info):
                if isinstance(item, FieldRule) and _plain(base):
                    found.append((f"{model.__name__}.{name}", item, base))
            for inner in _models(info.annotation):
                walk(inner)

    walk(InferenceService)
    return found


def _metadata(info: FieldInfo) -> list[Any]:
    out = list(info.metadata)
    tp = info.annotation
    while True:
        if get_origin(tp) in (Union, types.UnionType):
            tp = next(a for a in get_args(tp) if a is not type(None))
        elif get_origin(tp) is Annotated:
            tp, *extra = get_args(tp)
            out += extra
        else:
            return out


def _base(info: FieldInfo) -> Any:
    tp = info.annotation
    while get_origin(tp) in (Union, types.UnionType, Annotated):
        args = [a for a in get_args(tp) if a is not type(None)]
        tp = args[0]
    return tp


def _plain(tp: Any) -> bool:
    if tp in (str, int, float):
        return True
    origin = get_origin(tp)
    if origin is list:
        return _base_of(get_args(tp)[0]) in (str, int, float)
    if origin is dict:
        return all(_base_of(a) is str for a in get_args(tp))
    return False


def _base_of(tp: Any) -> Any:
    while get_origin(tp) is Annotated:
        tp = get_args(tp)[0]
    return tp


def _models(tp: Any) -> list[type[BaseModel]]:
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return [tp]
    return [m for arg in get_args(tp) for m in _models(arg)]


SITES = _field_rules()


@cache
def _program(cel: str) -> Any:
    return _ENV.program(_ENV.compile(cel))


def _cel_verdict(cel: str, value: Any) -> bool:
    result = _program(cel).evaluate({"self": celpy.json_to_cel(value)})
    assert not isinstance(result, celpy.CELEvalError), (cel, value, result)
    return bool(result)


def _strings(cel: str) -> st.SearchStrategy[str]:
    near = [
        st.from_regex(pattern, fullmatch=True, alphabet=st.characters(max_codepoint=0x7F))
        for pattern in re.findall(r"matches\('([^']*)'\)", cel)
        if pattern.startswith("^")
    ]
    anything = st.text(st.characters(exclude_categories=["Cs"]), max_size=12)
    return st.one_of(st.sampled_from(_TROUBLE), anything, *near)


def _values(tp: Any, cel: str) -> st.SearchStrategy[Any]:
    tp = _base_of(tp)
    if tp is str:
        return _strings(cel)
    if tp is int:
        return st.one_of(st.integers(-(2**63), 2**63 - 1), st.integers(-3, 70_000))
    if tp is float:
        return st.floats(-2000.0, 20_000.0, allow_nan=False)
    if get_origin(tp) is list:
        return st.lists(_values(get_args(tp)[0], cel), max_size=3)
    key, value = get_args(tp)
    return st.dictionaries(_values(key, cel), _values(value, cel), max_size=3)


def test_every_kind_of_field_rule_is_covered() -> None:
    where = {where for where, _, _ in SITES}
    assert {"EngineSpec.extra_args", "PodSettings.labels", "Toleration.key"} <= where
    assert len(SITES) >= 30


@pytest.mark.parametrize(
    ("where", "rule", "tp"), SITES, ids=[f"{w}: {r.cel[:40]}" for w, r, _ in SITES]
)
def test_cel_rule_and_its_python_twin_agree(where: str, rule: FieldRule, tp: Any) -> None:
    @settings(
        max_examples=30,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(value=_values(tp, rule.cel))
    def agree(value: Any) -> None:
        assert rule.check(value) == _cel_verdict(rule.cel, value), (where, value)

    agree()


def test_credential_twins_fold_case_as_re2_does() -> None:
    # RE2 folds K (Kelvin, U+212A) to k and long s (U+017F) to s, but not dotted or dotless
    # i (U+0130, U+0131), which Python's re does. Every character that folds to an ASCII
    # letter in either engine lies below U+3000 (Latin, Greek, Cyrillic, letterlike symbols).
    flag, env = re2.compile(CREDENTIAL_FLAG_RE), re2.compile(CREDENTIAL_ENV_RE)
    for code in range(0x3000):
        c = chr(code)
        arg, name = f"--{c}-token=x", f"{c}_TOKEN"
        assert is_credential_flag(arg) == (flag.fullmatch(arg) is not None), hex(code)
        assert is_credential_env(name) == (env.fullmatch(name) is not None), hex(code)
