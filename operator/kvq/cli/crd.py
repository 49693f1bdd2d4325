"""`kvq crd`: the InferenceService CRD, generated from the API models."""

from __future__ import annotations

import sys


def crd() -> None:
    """Print the InferenceService CustomResourceDefinition (generated from the API models)."""
    from kvq.api.crd import crd_yaml

    sys.stdout.write(crd_yaml())
