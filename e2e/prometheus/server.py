"""Starts Debian's Prometheus on 127.0.0.1 with static scrape targets, and stops it.

Never the package's system service: each run gets its own config file, its own TSDB in
a directory the caller owns (a temp dir), a free port and a short scrape interval, so
tests see a sample within seconds and leave nothing behind.

Each target carries the labels kvq's metrics reader selects on (`namespace`, `service`:
see operator/kvq/observe/prometheus.py), set statically here as a ServiceMonitor on the
engine Service would set them in a cluster.

Standard library only. Install the binary with e2e/prometheus/install.sh.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

HOST = "127.0.0.1"
BINARY = os.environ.get("KVQ_PROMETHEUS", "/usr/bin/prometheus")
READY_DEADLINE_S = 60.0


@dataclass(frozen=True)
class ScrapeTarget:
    """One `host:port` serving /metrics, and the labels its series get."""

    address: str
    labels: Mapping[str, str] = field(default_factory=dict)


@dataclass
class RunningPrometheus:
    process: subprocess.Popen[bytes]
    port: int
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self, grace_s: float = 15.0) -> int:
        """SIGTERM (Prometheus flushes and exits), SIGKILL after `grace_s`."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                return self.process.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
        return self.process.wait()


def installed() -> bool:
    return shutil.which(BINARY) is not None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def render_config(targets: Sequence[ScrapeTarget], scrape_interval_s: float) -> str:
    """prometheus.yml (JSON is YAML) with one static job for all targets."""
    interval = f"{scrape_interval_s:g}s"
    config = {
        "global": {"scrape_interval": interval, "scrape_timeout": interval},
        "scrape_configs": [
            {
                "job_name": "vllm",
                "metrics_path": "/metrics",
                "static_configs": [
                    {"targets": [target.address], "labels": dict(target.labels)}
                    for target in targets
                ],
            }
        ],
    }
    return json.dumps(config, indent=2, sort_keys=True)


def start_prometheus(
    workdir: Path,
    targets: Sequence[ScrapeTarget],
    *,
    scrape_interval_s: float = 2.0,
    ready_deadline_s: float = READY_DEADLINE_S,
) -> RunningPrometheus:
    """Runs Prometheus until `/-/ready` answers; raises (after stopping it) if it does not."""
    workdir.mkdir(parents=True, exist_ok=True)
    config_path = workdir / "prometheus.yml"
    config_path.write_text(render_config(targets, scrape_interval_s))
    port = free_port()
    log_path = workdir / "prometheus.log"
    argv = [
        BINARY,
        f"--config.file={config_path}",
        f"--storage.tsdb.path={workdir / 'data'}",
        f"--web.listen-address={HOST}:{port}",
        "--log.level=warn",
    ]
    with log_path.open("wb") as log:
        process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
    running = RunningPrometheus(process, port, log_path)
    try:
        _wait_ready(running, ready_deadline_s)
    except BaseException:
        running.stop()
        raise
    return running


@contextmanager
def prometheus_running(
    workdir: Path, targets: Sequence[ScrapeTarget], *, scrape_interval_s: float = 2.0
) -> Iterator[RunningPrometheus]:
    running = start_prometheus(workdir, targets, scrape_interval_s=scrape_interval_s)
    try:
        yield running
    finally:
        running.stop()


# /-/ready is polled (with the deadline below), not waited on blindly.
READY_POLL_INTERVAL_S = 0.2


def _wait_ready(running: RunningPrometheus, deadline_s: float) -> None:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if running.process.poll() is not None:
            raise RuntimeError(
                f"prometheus exited {running.process.returncode} at start:\n{running.log()}"
            )
        if _ready(running.url):
            return
        time.sleep(READY_POLL_INTERVAL_S)
    raise TimeoutError(f"prometheus not ready within {deadline_s:.0f} s:\n{running.log()}")


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as response:
            return int(response.status) == 200
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False
