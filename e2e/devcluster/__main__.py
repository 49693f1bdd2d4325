"""`python -m e2e.devcluster up|down|status|usage|demo` from the repository root."""

from e2e.devcluster.cli import app

app(prog_name="python -m e2e.devcluster")
