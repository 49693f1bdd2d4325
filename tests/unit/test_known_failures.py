"""failures.yaml, the classifier's data: every row has its source, and a broken file is
refused with the row named (not a classifier that silently knows less)."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import pytest
import yaml

from kvq.fallback.classifier import FailureKind, load_known_failures

ROWS = yaml.safe_load(resources.files("kvq.fallback").joinpath("failures.yaml").read_text())


@pytest.mark.parametrize("section", ["families", "patterns"])
def test_every_row_names_its_source(section: str) -> None:
    missing = [row for row in ROWS[section] if not str(row.get("source", "")).strip()]
    assert missing == []


def test_every_family_has_one_row() -> None:
    kinds = [row["kind"] for row in ROWS["families"]]
    assert sorted(kinds) == sorted(kind.value for kind in FailureKind)


def test_a_family_without_a_row_is_refused(tmp_path: Path) -> None:
    broken = {**ROWS, "families": [r for r in ROWS["families"] if r["kind"] != "DiskFull"]}
    path = tmp_path / "failures.yaml"
    path.write_text(yaml.safe_dump(broken))
    with pytest.raises(ValueError, match="no family row for DiskFull"):
        load_known_failures(path)


def test_a_regex_that_does_not_compile_is_refused_with_its_row(tmp_path: Path) -> None:
    patterns = [*ROWS["patterns"], {"kind": "ConfigError", "regex": "(unclosed", "reason": "x"}]
    path = tmp_path / "failures.yaml"
    path.write_text(yaml.safe_dump({**ROWS, "patterns": patterns}))
    with pytest.raises(ValueError, match=rf"pattern {len(patterns) - 1} \('\(unclosed'\)"):
        load_known_failures(path)
