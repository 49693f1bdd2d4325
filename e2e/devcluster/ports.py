"""Loopback ports for one cluster: from KVQ_PORT_BASE when set, else picked by the kernel."""

from __future__ import annotations

import os
import socket
from contextlib import ExitStack


def allocate_ports(names: list[str]) -> dict[str, int]:
    base = os.environ.get("KVQ_PORT_BASE")
    if base:
        return {name: int(base) + offset for offset, name in enumerate(names)}
    # Hold every socket open until all are bound so the kernel hands out distinct ports.
    with ExitStack() as stack:
        ports = {}
        for name in names:
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind(("127.0.0.1", 0))
            ports[name] = int(sock.getsockname()[1])
        return ports
