-- Argo CD health of a kvq.dev InferenceService, read from status.conditions and
-- status.observedGeneration (Lua 5.1, as Argo CD's gopher-lua runs it).
local hs = {}

local function condition(conditions, wanted)
  for _, c in ipairs(conditions) do
    if c.type == wanted then
      return c
    end
  end
  return nil
end

local function say(c, fallback)
  if c ~= nil and c.message ~= nil and c.message ~= "" then
    return c.message
  end
  return fallback
end

local status = obj.status
local generation = obj.metadata.generation
if status == nil or status.observedGeneration == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for kvq to reconcile the InferenceService"
  return hs
end
if generation ~= nil and status.observedGeneration < generation then
  hs.status = "Progressing"
  hs.message = "Waiting for kvq to observe generation " .. generation
  return hs
end

local conditions = status.conditions or {}
local degraded = condition(conditions, "Degraded")
local placed = condition(conditions, "Placed")
local ready = condition(conditions, "Ready")

if degraded ~= nil and degraded.status == "True" then
  hs.status = "Degraded"
  hs.message = say(degraded, "Degraded")
  return hs
end
if obj.spec ~= nil and obj.spec.replicas == 0 then
  hs.status = "Suspended"
  hs.message = "Scaled to zero (spec.replicas is 0)"
  return hs
end
if placed ~= nil and placed.status == "False" then
  hs.status = "Degraded"
  hs.message = say(placed, "No node pool can run this InferenceService")
  return hs
end
if ready ~= nil and ready.status == "False" and ready.reason == "InvalidSpec" then
  hs.status = "Degraded"
  hs.message = say(ready, "The spec is invalid")
  return hs
end
if ready ~= nil and ready.status == "True" then
  hs.status = "Healthy"
  hs.message = say(ready, "Ready")
  return hs
end
hs.status = "Progressing"
hs.message = say(ready, "Waiting for the engine to become ready")
return hs
