"""A local Kubernetes control plane for development and integration tests.

Real etcd, kube-apiserver, kube-controller-manager and kube-scheduler on loopback with TLS
and RBAC, and KWOK simulating GPU nodes from a cluster profile (e2e/clusters/*.yaml).
Not part of the operator's pure core: it starts processes and writes files.
"""
