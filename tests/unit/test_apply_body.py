"""The operator's apply patch carries every string the API server would store, unchanged.

Apply patches are read by the API server as YAML: a JSON body with a surrogate-pair escape
(the Python client's json.dumps of an emoji) is refused, a raw C1 control character is
refused, and a raw NEL or line separator is read as a line break. PyYAML reads as the
server's YAML reader does (the same printable set and line breaks).
"""

from __future__ import annotations

import yaml

from kvq.k8s.apply import apply_body

TEXTS = {
    "emoji": "\U0001f642",
    "supplementary": "\U00010000 \U0010fffd",
    "delete": "a\x7fb",
    "c1": "\x80\x9f",
    "nel": "a\x85b",
    "line-separator": "a\u2028b\u2029c",
    "noncharacters": "\ufffe\uffff",
    "bom": "a\ufeffb",
    "controls": "a\tb\nc\rd\x00",
    "quotes": "a\"b'c\\d",
    "escape-as-text": "\\ud83d\\ude42",
    "accents": "é日本",
}


def _manifest() -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "texts", "namespace": "team-a"},
        "data": TEXTS,
    }


def test_every_string_reads_back_as_it_was_written() -> None:
    assert yaml.safe_load(apply_body(_manifest()).decode("utf-8")) == _manifest()


def test_a_character_beyond_the_bmp_is_sent_as_utf8_not_as_a_surrogate_pair() -> None:
    body = apply_body({**_manifest(), "data": {"emoji": "\U0001f642"}})
    assert "\U0001f642".encode() in body
    assert b"\\ud83d" not in body
