"""API clients the executor uses, configured the way kopf logs in (in-cluster, else kubeconfig)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.dynamic import DynamicClient

# Reconcile workers and the writers they fan out to share one client: enough connections
# that none is opened and thrown away per request (urllib3's default is 5 per CPU).
CONNECTIONS = 64


def load_api_client(kubeconfig: str | None = None) -> k8s.ApiClient:
    """An ApiClient of its own: `kubeconfig` if given, else in-cluster, else $KUBECONFIG/~/.kube."""
    configuration = k8s.Configuration()
    loaded = False
    if kubeconfig is None:
        try:
            k8s_config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
            loaded = True
        except k8s_config.ConfigException:
            pass
    if not loaded:
        k8s_config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=kubeconfig, client_configuration=configuration
        )
    configuration.connection_pool_maxsize = CONNECTIONS
    return k8s.ApiClient(configuration)


@dataclass
class Clients:
    """The dynamic client (any kind, by discovery) and plain requests by path.

    No typed API class (CoreV1Api, CustomObjectsApi): the client builds a pydantic
    validator for each of their methods on import, 92 MB of the operator's memory for the
    three calls kvq makes through them (an Event, a status, a log), and validates every
    call's arguments again (6% of the operator's CPU in a fleet's rollout)."""

    api: k8s.ApiClient
    # The dynamic client is untyped: kept as Any at this one boundary.
    _dynamic: Any = field(default=None, repr=False)

    @property
    def dynamic(self) -> Any:
        # Discovery happens on first use, not at construction (startup stays fast offline).
        if self._dynamic is None:
            self._dynamic = DynamicClient(self.api)  # type: ignore[no-untyped-call]
        return self._dynamic

    def call(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        query: Sequence[tuple[str, Any]] = (),
        accept: str = "application/json",
    ) -> Any:
        """One request, its urllib3 response unparsed (`.data`: bytes); errors raise the
        dynamic client's ApiException subclasses (`.status`)."""
        response = self.dynamic.request(
            method,
            path,
            body=body,
            query_params=list(query),
            header_params={"Accept": accept},
            serialize=False,
        )
        # Read now, kept in `.data`: the connection goes back to the pool only at the
        # body's end (an Event's answer that nobody read cost a new TLS connection).
        _ = response.data
        return response

    def discover(self) -> None:
        """Run API discovery now (at start-up) rather than in the first reconcile."""
        self.dynamic.resources.get(api_version="v1", kind="ConfigMap")

    def resource(self, api_version: str, kind: str) -> Any:
        return self.dynamic.resources.get(api_version=api_version, kind=kind)

    def serves(self, api_version: str, kind: str) -> bool:
        """Is `kind` served (a CRD installed)? Asked again after a miss: discovery is cached."""
        from kubernetes.dynamic.exceptions import ResourceNotFoundError

        try:
            self.resource(api_version, kind)
        except ResourceNotFoundError:
            self.dynamic.resources.invalidate_cache()
            try:
                self.resource(api_version, kind)
            except ResourceNotFoundError:
                return False
        return True
