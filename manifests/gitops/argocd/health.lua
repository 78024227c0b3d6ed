-- Argo CD health check for m3fleet.dev/MiniMaxM3Deployment (Lua 5.1, run by Argo CD with `obj`).
-- Install it with argocd-cm-patch.yaml (generated from this file by hack/generate.py).
--
--   Progressing  no status yet, or status.observedGeneration behind metadata.generation (the operator
--                has not acted on the latest spec), or a rollout/scale under way (Ready=False).
--   Degraded     Degraded=True: the operator cannot do what the spec asks, or engine pods fail. The message
--                carries the reason: InvalidSpec, LeaderWorkerSetNotInstalled, ComputeDomainNotInstalled,
--                ApplyFailed, CrashLoopBackOff, OOMKilled, ImagePullBackOff, CreateContainerConfigError, FailedCreate.
--   Healthy      Ready=True for the current generation (every replica ready, or scaled to zero).
local hs = {}

local function find(conditions, wanted)
  for _, c in ipairs(conditions) do
    if c.type == wanted then
      return c
    end
  end
  return nil
end

local function explain(c, fallback)
  if c == nil then
    return fallback
  end
  local text = c.reason or fallback
  if c.message ~= nil and c.message ~= "" then
    text = text .. ": " .. c.message
  end
  return text
end

if obj.status == nil or obj.status.conditions == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the m3fleet operator to report status"
  return hs
end

local generation = obj.metadata.generation
local observed = obj.status.observedGeneration
if generation ~= nil and (observed == nil or observed < generation) then
  hs.status = "Progressing"
  hs.message = "Waiting for the m3fleet operator to observe generation " .. tostring(generation)
  return hs
end

local conditions = obj.status.conditions
local degraded = find(conditions, "Degraded")
if degraded ~= nil and degraded.status == "True" then
  hs.status = "Degraded"
  hs.message = explain(degraded, "Degraded")
  return hs
end

local ready = find(conditions, "Ready")
if ready ~= nil and ready.status == "True" then
  hs.status = "Healthy"
  hs.message = explain(ready, "Ready")
  return hs
end

hs.status = "Progressing"
hs.message = explain(ready or find(conditions, "Progressing"), "Waiting for replicas to become ready")
return hs
