"""The Argo CD health check of an InferenceService, run under Lua 5.1 as Argo CD runs it.

Cases come from health_test.yaml in Argo CD's own layout (the file Argo CD's
resource_customizations tests read); the argocd-cm snippet must carry the same Lua.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from lupa import lua51

ARGOCD = Path(__file__).resolve().parents[2] / "e2e" / "argocd"
CHECK_DIR = ARGOCD / "kvq.dev" / "InferenceService"
HEALTH_KEY = "resource.customizations.health.kvq.dev_InferenceService"


def health_of(obj: dict[str, Any]) -> dict[str, str]:
    """Run health.lua on `obj` the way Argo CD does: `obj` global, the script returns hs."""
    lua = lua51.LuaRuntime()
    lua.globals().obj = lua.table_from(obj, recursive=True)
    result = lua.execute((CHECK_DIR / "health.lua").read_text())
    return {key: str(result[key]) for key in ("status", "message") if result[key] is not None}


def _cases() -> list[Any]:
    tests = yaml.safe_load((CHECK_DIR / "health_test.yaml").read_text())["tests"]
    return [pytest.param(t, id=Path(t["inputPath"]).stem) for t in tests]


@pytest.mark.parametrize("case", _cases())
def test_health_matches_the_argo_cd_test_case(case: dict[str, Any]) -> None:
    obj = yaml.safe_load((CHECK_DIR / case["inputPath"]).read_text())
    assert health_of(obj) == case["healthStatus"]


def test_every_health_status_argo_cd_knows_is_covered() -> None:
    statuses = {c.values[0]["healthStatus"]["status"] for c in _cases()}
    assert statuses == {"Healthy", "Progressing", "Degraded", "Suspended"}


def test_every_testdata_file_is_a_case() -> None:
    used = {Path(c.values[0]["inputPath"]).name for c in _cases()}
    assert used == {p.name for p in (CHECK_DIR / "testdata").glob("*.yaml")}


def test_testdata_conditions_are_ones_kvq_writes() -> None:
    # The health check reads condition types by name: a typo in testdata would test nothing.
    from typing import get_args

    from kvq.api.status import ConditionType

    known = set(get_args(ConditionType))
    for path in (CHECK_DIR / "testdata").glob("*.yaml"):
        conditions = (yaml.safe_load(path.read_text()).get("status") or {}).get("conditions", [])
        assert {c["type"] for c in conditions} <= known, path.name


def test_argocd_cm_snippet_carries_health_lua_verbatim() -> None:
    committed = (ARGOCD / "argocd-cm.yaml").read_text()
    generated = subprocess.run(
        [sys.executable, str(ARGOCD / "argocd_cm.py")], capture_output=True, text=True, check=True
    ).stdout
    regenerate = "python e2e/argocd/argocd_cm.py > e2e/argocd/argocd-cm.yaml"
    assert committed == generated, f"regenerate: {regenerate}"
    data = yaml.safe_load(committed)["data"]
    assert data[HEALTH_KEY] == (CHECK_DIR / "health.lua").read_text()


def test_example_applications_point_at_paths_that_exist() -> None:
    root = ARGOCD.parents[1]
    apps = list(yaml.safe_load_all((root / "examples" / "argocd" / "application.yaml").read_text()))
    assert [a["kind"] for a in apps] == ["Application", "Application"]
    for app in apps:
        source = app["spec"]["source"]
        path = root / source["path"]
        assert path.is_dir(), source["path"]
        include = source.get("directory", {}).get("include")
        assert include is None or (path / include).is_file(), include
