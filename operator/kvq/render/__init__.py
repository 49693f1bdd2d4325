"""Pure rendering: an InferenceService, a pool and the effective settings -> manifests."""

from kvq.render.args import (
    DroppedFlag,
    RenderedArgs,
    container_command,
    engine_args,
    engine_command,
)
from kvq.render.manifests import ONE_AT_A_TIME, SURGE, Rollout, render_manifests, spec_hash
from kvq.render.settings import EffectiveSettings, RenderError, effective_settings

__all__ = [
    "ONE_AT_A_TIME",
    "SURGE",
    "DroppedFlag",
    "EffectiveSettings",
    "RenderError",
    "RenderedArgs",
    "Rollout",
    "container_command",
    "effective_settings",
    "engine_args",
    "engine_command",
    "render_manifests",
    "spec_hash",
]
