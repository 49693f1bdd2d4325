"""Kubernetes API clients for a dev cluster's kubeconfigs (admin or viewer)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from kubernetes import client as k8s
from kubernetes import config as k8s_config

if TYPE_CHECKING:
    from e2e.devcluster.cluster import ClusterState


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


@dataclass(frozen=True)
class Kube:
    """A running dev cluster's state and its admin API client, with typed API groups."""

    state: ClusterState
    api: k8s.ApiClient

    @property
    def core(self) -> k8s.CoreV1Api:
        return k8s.CoreV1Api(self.api)

    @property
    def apps(self) -> k8s.AppsV1Api:
        return k8s.AppsV1Api(self.api)

    @property
    def custom(self) -> k8s.CustomObjectsApi:
        return k8s.CustomObjectsApi(self.api)

    @property
    def extensions(self) -> k8s.ApiextensionsV1Api:
        return k8s.ApiextensionsV1Api(self.api)

    @property
    def rbac(self) -> k8s.RbacAuthorizationV1Api:
        return k8s.RbacAuthorizationV1Api(self.api)
