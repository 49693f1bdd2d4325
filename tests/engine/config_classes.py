"""Builds catalog rows' config classes the way vLLM does (run by the engine venv's Python).

Reads `[{"name": ..., "config": {...}}, ...]` as JSON on stdin and prints one JSON object
per row: the config class transformers built (or the error it raised), the vLLM module of
the row's `architectures[0]`, and `unset`: attributes that module reads from the config
which the built config leaves None although the row never says so. Such a read is how
DeepSeek-V2-Lite's row failed on vLLM 0.26 ("num_expert_group and topk_group must be
provided when use_grouped_topk is True": `getattr(config, "n_group", 1)` meets
DeepseekV2Config's default None). A read with an explicit None default
(`getattr(config, "head_dim", None)`) tolerates None and is not reported.

Standalone on purpose: the engine venv has transformers and vLLM, not kvq.
"""

from __future__ import annotations

import json
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

_DIRECT = re.compile(r"\b(?:hf_|text_)?config\.([a-z_][a-z0-9_]*)\b(?!\s*\()")
_GETATTR = re.compile(
    r"""getattr\(\s*(?:self\.)?(?:hf_|text_)?config\s*,\s*["']([a-z_][a-z0-9_]*)["']\s*(,\s*([^)]*))?\)"""
)


def _reads(source: str) -> set[str]:
    """Attributes read without a None default."""
    defaults = [(m.group(1), (m.group(3) or "").strip()) for m in _GETATTR.finditer(source)]
    tolerant = {name for name, default in defaults if default == "None"}
    strict = {name for name, default in defaults if default != "None"}
    return (set(_DIRECT.findall(source)) - tolerant) | strict


def check(row: dict[str, Any]) -> dict[str, Any]:
    from transformers import AutoConfig
    from vllm.model_executor.models import registry

    config = row["config"]
    result: dict[str, Any] = {"name": row["name"]}
    with tempfile.TemporaryDirectory() as directory:
        Path(directory, "config.json").write_text(json.dumps(config))
        try:
            built = AutoConfig.from_pretrained(directory)
        except Exception as error:  # the row is reported, the others still checked
            result["error"] = f"{type(error).__name__}: {error}"
            return result
    result["config_class"] = type(built).__name__
    architecture = (config.get("architectures") or [None])[0]
    entry = registry._VLLM_MODELS.get(architecture)
    if entry is None:
        result["error"] = f"vLLM has no model class {architecture!r}"
        return result
    module_file = Path(registry.__file__).parent / f"{entry[0]}.py"
    result["vllm_module"] = f"vllm/model_executor/models/{module_file.name}"
    result["unset"] = sorted(
        name
        for name in _reads(module_file.read_text())
        if name not in config and hasattr(built, name) and getattr(built, name) is None
    )
    return result


def main() -> None:
    import transformers
    import vllm

    rows = json.load(sys.stdin)
    print(json.dumps({"transformers": transformers.__version__, "vllm": vllm.__version__}))
    for row in rows:
        print(json.dumps(check(row)), flush=True)


if __name__ == "__main__":
    main()
