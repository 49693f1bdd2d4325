"""A tiny OpenAI-compatible server over real HTTP, whose answers a test scripts.

It speaks what `kvq probe` uses of vLLM's server: `GET /v1/models` (with vLLM's
`max_model_len`), `GET /metrics` (with `vllm:cache_config_info`), `POST /v1/completions`
(text, usage, logprobs). Tokens are whitespace-separated words, so prompt lengths and
logprobs are easy to reason about in a test. What it answers comes from a `Model`: a
function of the prompt, given the facts the prompt holds.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from kvq.probe import tasks

# A model: prompt -> (answer text, logprob of each answer word).
Model = Callable[[str], tuple[str, list[float]]]

_QUESTION = re.compile(r"What is the secret number of the (\w+)\?")
_RECORD = re.compile(r"Record: (\w+) with (.*)\nJSON:$")


def needle_answer(prompt: str) -> str | None:
    """The value of the asked key, as a perfect reader of the prompt finds it."""
    asked = _QUESTION.search(prompt)
    if asked is None:
        return None
    fact = re.search(rf"The secret number of the {asked.group(1)} is (\d+)\.", prompt)
    return fact.group(1) if fact else None


def needle_depth(prompt: str) -> float:
    """Where the asked fact sits in the haystack, as a share of the prompt's words."""
    asked = _QUESTION.search(prompt)
    assert asked is not None
    at = prompt.index(f"The secret number of the {asked.group(1)} is")
    return len(prompt[:at].split()) / len(prompt[: asked.start()].split())


def record_fields(prompt: str) -> dict[str, str]:
    """`Record: person with name Alice, age 31, city Paris` -> {name: Alice, ...}."""
    record = _RECORD.search(prompt)
    assert record is not None, prompt
    fields = {}
    for part in record.group(2).split(", "):
        name, _, value = part.partition(" ")
        fields[name] = value
    return fields


def perfect_json(prompt: str) -> str:
    """The JSON object the prompt asks for, typed as the schema line says."""
    fields = record_fields(prompt)
    schema = re.search(r"Schema: \{(.*)\}", prompt)
    assert schema is not None
    out: dict[str, Any] = {}
    for declaration in schema.group(1).split(", "):
        name, kind = (s.strip().strip('"') for s in declaration.split(":"))
        raw = fields[name]
        if kind == "integer":
            out[name] = int(raw)
        elif kind == "boolean":
            out[name] = raw == "yes"
        elif kind == "array":
            out[name] = raw.split(" and ")
        else:
            out[name] = raw
    return json.dumps(out)


def perfect_model(prompt: str) -> tuple[str, list[float]]:
    """Retrieves every needle, writes exact JSON, continues without repeating itself."""
    value = needle_answer(prompt)
    if value is not None:
        text = f" {value}."
    elif prompt.endswith("JSON:"):
        text = " " + perfect_json(prompt)
    else:
        text = " " + " ".join(f"word{i}" for i in range(40))
    return text, [-0.5] * len(text.split())


@dataclass
class FakeServer:
    model: Model
    max_model_len: int | None = 4096
    cache_dtype: str = "fp8"
    block_size: int = 16
    requests: list[dict[str, Any]] = field(default_factory=list)
    url: str = ""


def _handler(fake: FakeServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # quiet
            return

        def _send(self, status: int, body: str, content_type: str = "application/json") -> None:
            payload = body.encode()
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def do_GET(self) -> None:
            if self.path == "/v1/models":
                card: dict[str, Any] = {"id": "fake-model", "object": "model"}
                if fake.max_model_len is not None:
                    card["max_model_len"] = fake.max_model_len
                self._send(200, json.dumps({"object": "list", "data": [card]}))
            elif self.path == "/metrics":
                self._send(
                    200,
                    "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n"
                    "# TYPE vllm:cache_config_info gauge\n"
                    f'vllm:cache_config_info{{block_size="{fake.block_size}",'
                    f'cache_dtype="{fake.cache_dtype}",num_gpu_blocks="1000",'
                    'kv_cache_size_tokens="16000"} 1.0\n',
                    "text/plain; version=0.0.4",
                )
            else:
                self._send(404, json.dumps({"error": "not found"}))

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            fake.requests.append(body)
            prompt = body["prompt"]
            prompt_tokens = len(prompt.split())
            if fake.max_model_len is not None and prompt_tokens > fake.max_model_len:
                self._send(400, json.dumps({"error": {"message": "prompt too long"}}))
                return
            text, logprobs = fake.model(prompt)
            words = text.split(" ")[1:] if text.startswith(" ") else text.split(" ")
            words = words[: body["max_tokens"]]
            tokens = [f" {w}" for w in words]
            text = "".join(tokens)
            choice: dict[str, Any] = {
                "index": 0,
                "text": text,
                "finish_reason": "length" if len(words) == body["max_tokens"] else "stop",
                "logprobs": None,
            }
            if body.get("logprobs"):
                choice["logprobs"] = {
                    "tokens": tokens,
                    "token_logprobs": logprobs[: len(tokens)],
                    "top_logprobs": None,
                    "text_offset": None,
                }
            self._send(
                200,
                json.dumps(
                    {
                        "id": "cmpl-fake",
                        "object": "text_completion",
                        "created": 0,
                        "model": body["model"],
                        "choices": [choice],
                        "usage": {
                            "prompt_tokens": prompt_tokens,
                            "completion_tokens": len(tokens),
                            "total_tokens": prompt_tokens + len(tokens),
                        },
                    }
                ),
            )

    return Handler


@contextmanager
def serving(fake: FakeServer) -> Iterator[FakeServer]:
    """Serves `fake` on a free loopback port for the duration of the block."""
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(fake))
    fake.url = f"http://127.0.0.1:{httpd.server_address[1]}"
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield fake
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()


def closed_port_url() -> str:
    """A URL nobody listens on (the kernel's pick, released at once)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


__all__ = ["FakeServer", "closed_port_url", "perfect_model", "serving", "tasks"]
