"""Thin kopf glue: indices, one reconcile(), and the registry `kvq run` starts."""
