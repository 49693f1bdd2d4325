"""kvq.observe: what the operator reads besides the API server (engine metrics, Prometheus).

I/O lives in `prometheus.py`; `series.py` is the pure part (which series, how replicas add
up) so it is tested without a server.
"""
