"""Kubernetes API clients for a dev cluster's kubeconfigs (admin or viewer)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from kubernetes import client as k8s
from kubernetes import config as k8s_config


def api_client(kubeconfig: Path | str) -> k8s.ApiClient:
    """An ApiClient of its own (no global default); close it with `close_client`."""
    api: k8s.ApiClient = k8s_config.new_client_from_config(  # type: ignore[no-untyped-call]
        config_file=str(kubeconfig)
    )
    return api


def close_client(api: k8s.ApiClient) -> None:
    api.close()  # type: ignore[no-untyped-call]


@contextmanager
def open_client(kubeconfig: Path | str) -> Iterator[k8s.ApiClient]:
    api = api_client(kubeconfig)
    try:
        yield api
    finally:
        close_client(api)
