"""Imports e2e/gpu's runner package for the GPU tier's unit tests, and a stand-in engine."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "vllm"
sys.path.insert(0, str(REPO / "e2e" / "gpu"))

# A stand-in for `python -m vllm.entrypoints.openai.api_server`: it replays a captured
# H200 start-up log (the KV figures follow the dtype), serves /health, /metrics and
# /v1/completions, and for fp8_e5m2 replays the captured crash and exits 1.
FAKE_API_SERVER = r"""
import argparse, http.server, json, os, re, sys, threading
p = argparse.ArgumentParser()
for flag in ("--model", "--served-model-name", "--port", "--kv-cache-dtype",
             "--tensor-parallel-size", "--gpu-memory-utilization", "--max-model-len",
             "--load-format"):
    p.add_argument(flag)
p.add_argument("--skip-tokenizer-init", action="store_true")
a = p.parse_args()
fixtures = os.environ["FAKE_VLLM_FIXTURES"]
if a.kv_cache_dtype == "fp8_e5m2":
    sys.stdout.write(open(f"{fixtures}/h200-v0.26.0-llama3-8b-fp8_e5m2-crash.log").read())
    sys.exit(1)
log = open(f"{fixtures}/h200-v0.26.0-llama3-8b-auto-ok.log").read()
blocks = 55732 * (2 if a.kv_cache_dtype.startswith("fp8") else 1)
log = log.replace("891,712 tokens", f"{blocks * 16:,} tokens")
head = log.split("Capturing CUDA graphs")[0]
sys.stdout.write(head + "\nINFO:     Application startup complete.\n")
sys.stdout.flush()
running = [0]
scrapes = [0]  # /metrics answers that counted a running request
seen = threading.Condition()
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path == "/health":
            body = b""
        else:
            with seen:
                if running[0]:
                    scrapes[0] += 1
                    seen.notify_all()
            body = (
                f'vllm:cache_config_info{{block_size="16",cache_dtype="{a.kv_cache_dtype}",'
                f'num_gpu_blocks="{blocks}"}} 1.0\n'
                f'vllm:kv_cache_usage_perc{{engine="0"}} {running[0] / 200}\n'
                'vllm:num_preemptions_total{engine="0"} 0.0\n'
            ).encode()
        self.send_response(200); self.end_headers(); self.wfile.write(body)
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with seen:
            running[0] += 1
            # Answered once a /metrics scrape has counted it running (as a real engine's
            # gauge would), within a deadline.
            began = scrapes[0]
            seen.wait_for(lambda: scrapes[0] > began, timeout=10)
        answer = {"usage": {"prompt_tokens": len(body["prompt"]),
                            "completion_tokens": body["max_tokens"]}}
        with seen:
            running[0] -= 1
        data = json.dumps(answer).encode()
        self.send_response(200); self.end_headers(); self.wfile.write(data)
    def log_message(self, *args):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", int(a.port)), H).serve_forever()
"""


def write_fake_vllm(root: Path) -> Path:
    """A directory that, on PYTHONPATH, makes `-m vllm.entrypoints.openai.api_server` the
    stand-in."""
    package = root / "vllm" / "entrypoints" / "openai"
    package.mkdir(parents=True)
    for folder in (root / "vllm", root / "vllm" / "entrypoints", package):
        (folder / "__init__.py").write_text("")
    (package / "api_server.py").write_text(FAKE_API_SERVER)
    return root
