"""kvq: a Kubernetes operator for vLLM inference with a quantized KV cache."""

__version__ = "0.1.0"
