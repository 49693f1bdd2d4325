"""The only code that talks to the API server: apply, delete, status, events, log tails."""
