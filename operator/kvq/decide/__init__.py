"""Pure decisions: a snapshot of the world in, a plan (objects, status, events) out."""
