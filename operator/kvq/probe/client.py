"""The probe's only I/O: one OpenAI-compatible server (completions, models, /metrics).

Completions go through the `openai` client (greedy: temperature 0, a fixed seed);
`/v1/models` and `/metrics` through `httpx`, which the `openai` client is built on.
Identical requests are answered from memory: at temperature 0 the answer is the same,
and suites that share prompts (agreement reuses the others') pay once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import httpx
import openai
from prometheus_client.parser import text_string_to_metric_families

DEFAULT_SEED = 1234
# vLLM's gauge that carries the KV-cache configuration in its labels.
CACHE_CONFIG_METRIC = "vllm:cache_config_info"


class EngineUnreachableError(Exception):
    """The server did not answer at all (connection refused, DNS, timeout)."""


class RequestRejectedError(Exception):
    """The server answered with an error for this request (e.g. the prompt is too long)."""


@dataclass(frozen=True)
class Completion:
    text: str
    tokens: tuple[str, ...]
    token_logprobs: tuple[float, ...]
    prompt_tokens: int
    finish_reason: str


@dataclass(frozen=True)
class ServedModel:
    name: str
    max_model_len: int | None


def api_root(url: str) -> str:
    """`http://host:port` from `http://host:port`, `.../` or `.../v1`."""
    root = url.rstrip("/")
    return root.removesuffix("/v1")


@dataclass
class EngineClient:
    url: str
    model: str | None = None
    timeout_s: float = 120.0
    seed: int = DEFAULT_SEED
    api_key: str = "EMPTY"
    _memo: dict[tuple[str, int, bool], Completion] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self.root = api_root(self.url)
        self._http = httpx.Client(base_url=self.root, timeout=self.timeout_s)
        self._openai = openai.OpenAI(
            base_url=f"{self.root}/v1",
            api_key=self.api_key,
            timeout=self.timeout_s,
            max_retries=1,
        )

    def close(self) -> None:
        self._http.close()
        self._openai.close()

    def served_model(self) -> ServedModel:
        """The model to probe: `--model`, else the first one served; its max_model_len."""
        try:
            response = self._http.get("/v1/models")
            response.raise_for_status()
        except httpx.TransportError as error:
            raise EngineUnreachableError(f"{self.root}: {error}") from error
        except httpx.HTTPStatusError as error:
            raise RequestRejectedError(f"GET /v1/models: {error}") from error
        cards: list[dict[str, Any]] = response.json().get("data", [])
        if not cards:
            raise RequestRejectedError("GET /v1/models lists no model")
        wanted = self.model or str(cards[0]["id"])
        card = next((c for c in cards if c.get("id") == wanted), {"id": wanted})
        self.model = wanted
        length = card.get("max_model_len")  # vLLM's extension of the OpenAI model card
        return ServedModel(wanted, int(length) if length else None)

    def cache_config(self) -> dict[str, str]:
        """The labels of vLLM's `cache_config_info` gauge ({} where /metrics lacks it)."""
        try:
            response = self._http.get("/metrics")
        except httpx.TransportError as error:
            raise EngineUnreachableError(f"{self.root}/metrics: {error}") from error
        if response.status_code != httpx.codes.OK:
            return {}
        for family in text_string_to_metric_families(response.text):
            # The parser drops the `_info` suffix of info metrics: compare both spellings.
            if CACHE_CONFIG_METRIC.startswith(family.name) and family.samples:
                labels = dict(family.samples[0].labels)
                if "cache_dtype" in labels:
                    return labels
        return {}

    def complete(self, prompt: str, max_tokens: int, *, logprobs: bool) -> Completion:
        key = (prompt, max_tokens, logprobs)
        if key in self._memo:
            return self._memo[key]
        try:
            response = self._openai.completions.create(
                model=self.model or "",
                prompt=prompt,
                max_tokens=max_tokens,
                temperature=0.0,
                seed=self.seed,
                logprobs=1 if logprobs else None,
            )
        except (openai.APIConnectionError, openai.APITimeoutError) as error:
            raise EngineUnreachableError(f"{self.root}: {error}") from error
        except openai.APIStatusError as error:
            raise RequestRejectedError(f"HTTP {error.status_code}: {error.message}") from error
        choice = response.choices[0]
        tokens: tuple[str, ...] = ()
        token_logprobs: tuple[float, ...] = ()
        if choice.logprobs is not None:
            tokens = tuple(choice.logprobs.tokens or ())
            token_logprobs = tuple(float(x or 0.0) for x in choice.logprobs.token_logprobs or ())
        completion = Completion(
            text=choice.text,
            tokens=tokens,
            token_logprobs=token_logprobs,
            prompt_tokens=response.usage.prompt_tokens if response.usage else 0,
            finish_reason=str(choice.finish_reason),
        )
        self._memo[key] = completion
        return completion
