"""API clients the executor uses, configured the way kopf logs in (in-cluster, else kubeconfig)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.dynamic import DynamicClient


def load_api_client(kubeconfig: str | None = None) -> k8s.ApiClient:
    """An ApiClient of its own: `kubeconfig` if given, else in-cluster, else $KUBECONFIG/~/.kube."""
    if kubeconfig is None:
        try:
            configuration = k8s.Configuration()
            k8s_config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
            return k8s.ApiClient(configuration)
        except k8s_config.ConfigException:
            pass
    api: k8s.ApiClient = k8s_config.new_client_from_config(  # type: ignore[no-untyped-call]
        config_file=kubeconfig
    )
    return api


@dataclass
class Clients:
    """The typed core API (events, logs) and the dynamic client (any kind, by apiVersion/kind)."""

    api: k8s.ApiClient
    # The dynamic client is untyped: kept as Any at this one boundary.
    _dynamic: Any = field(default=None, repr=False)

    @property
    def core(self) -> k8s.CoreV1Api:
        return k8s.CoreV1Api(self.api)

    @property
    def dynamic(self) -> Any:
        # Discovery happens on first use, not at construction (startup stays fast offline).
        if self._dynamic is None:
            self._dynamic = DynamicClient(self.api)  # type: ignore[no-untyped-call]
        return self._dynamic

    def resource(self, api_version: str, kind: str) -> Any:
        return self.dynamic.resources.get(api_version=api_version, kind=kind)
