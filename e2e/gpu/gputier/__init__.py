"""kvq's GPU tier: kvq's rendered vLLM command on a real NVIDIA GPU (see e2e/gpu/README.md).

Modules hold what their names say; only `tier` and `load` touch processes and sockets, the
rest is pure and unit-tested against captured vLLM output (tests/unit/test_gpu_*.py).
"""
