"""Pure rendering: an InferenceService, a pool and the effective settings -> manifests."""

from kvq.render.args import (
    DroppedFlag,
    RenderedArgs,
    container_command,
    engine_args,
    engine_command,
)
from kvq.render.manifests import render_manifests, spec_hash
from kvq.render.settings import EffectiveSettings, RenderError, effective_settings

__all__ = [
    "DroppedFlag",
    "EffectiveSettings",
    "RenderError",
    "RenderedArgs",
    "container_command",
    "effective_settings",
    "engine_args",
    "engine_command",
    "render_manifests",
    "spec_hash",
]
