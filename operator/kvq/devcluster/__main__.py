"""`python -m kvq.devcluster up|down|status` until the main CLI mounts the sub-app."""

from kvq.devcluster.cli import app

app(prog_name="kvq dev-cluster")
