"""`kvq fetch`: download a model into the cache volume before the engine starts.

Runs as the engine pod's init container, from the operator's image. `layout` (where things
live in the cache) and `failures` (what a failed download means) are pure and shared with
the renderer and the failure classifier; `hf` and `s3` do the downloading.
"""
