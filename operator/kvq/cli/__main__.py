"""`python -m kvq.cli`: the `kvq` command."""

from kvq.cli import main

main()
