"""What a running dev cluster costs: each component's CPU and RSS over a window, and the API
server's request rate (from its own /metrics), for `python -m e2e.devcluster usage`."""

from __future__ import annotations

import os
import re
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from e2e.devcluster.processes import Running, is_alive
from e2e.devcluster.rest import Rest

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
_REQUESTS = re.compile(r"^apiserver_request_total\{([^}]*)\} (\S+)$", re.M)
_VERB = re.compile(r'verb="([^"]+)"')


@dataclass(frozen=True)
class ComponentUsage:
    name: str
    cpu_cores: float  # average over the window: 1.0 is one core busy
    rss_mib: float


@dataclass(frozen=True)
class Usage:
    seconds: float
    components: list[ComponentUsage]
    requests_per_second: dict[str, float]  # by verb, from apiserver_request_total


def measure_usage(processes: list[Running], rest: Rest, seconds: float) -> Usage:
    """Sample CPU time and request counters at both ends of a `seconds` window."""
    alive = [p for p in processes if is_alive(p)]
    cpu_before = {p.name: _cpu_seconds(p.pid) for p in alive}
    requests_before = _requests_by_verb(rest)
    began = time.monotonic()
    time.sleep(seconds)  # the measurement window itself, not a wait for a condition
    elapsed = time.monotonic() - began
    requests_after = _requests_by_verb(rest)
    components = [
        ComponentUsage(
            p.name,
            round((_cpu_seconds(p.pid) - cpu_before[p.name]) / elapsed, 3),
            round(_rss_mib(p.pid), 1),
        )
        for p in alive
        if is_alive(p)
    ]
    rates = {
        verb: round((requests_after[verb] - requests_before.get(verb, 0.0)) / elapsed, 2)
        for verb in sorted(requests_after)
    }
    return Usage(round(elapsed, 1), components, {v: r for v, r in rates.items() if r > 0})


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    # utime and stime are the 12th and 13th fields after the command.
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _requests_by_verb(rest: Rest) -> dict[str, float]:
    text = rest.get_text("/metrics")
    totals: defaultdict[str, float] = defaultdict(float)
    for labels, value in _REQUESTS.findall(text):
        verb = _VERB.search(labels)
        if verb:
            totals[verb.group(1)] += float(value)
    return dict(totals)
