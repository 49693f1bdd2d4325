"""The chart installs exactly the committed CRD (from `kvq crd`) plus kopf's peering CRDs."""

from __future__ import annotations

from pathlib import Path

import yaml
from e2e.devcluster.peering import peering_crds

ROOT = Path(__file__).resolve().parents[2]
CHART_CRDS = ROOT / "charts" / "kvq" / "crds"
KOPF_PEERINGS = "kopf-peerings.yaml"


def test_chart_crds_are_the_committed_crds_byte_for_byte() -> None:
    committed = {p.name: p.read_text() for p in (ROOT / "crds").glob("*.yaml")}
    charted = {p.name: p.read_text() for p in CHART_CRDS.glob("*.yaml") if p.name != KOPF_PEERINGS}
    assert committed, "no CRD in crds/"
    assert charted == committed, "copy them: cp crds/*.yaml charts/kvq/crds/"


def test_kopf_peering_crds_are_the_ones_the_operator_expects() -> None:
    docs = list(yaml.safe_load_all((CHART_CRDS / KOPF_PEERINGS).read_text()))
    assert docs == peering_crds()
    served = {(d["spec"]["group"], d["spec"]["names"]["kind"], d["spec"]["scope"]) for d in docs}
    assert served == {
        ("kopf.dev", "ClusterKopfPeering", "Cluster"),
        ("kopf.dev", "KopfPeering", "Namespaced"),
    }
