-- Argo CD health check for protobot.dev/ChangeSet (docs/gitops.md): register it in argocd-cm as
-- resource.customizations.health.protobot.dev_ChangeSet. Reads the conditions the operator writes:
-- Stalled=True is Degraded, Ready=True (the merge is verified on the default branch and materialized (a BuildWorkItem, or an omitted reservation)) is Healthy, anything else is Progressing.
-- A status older than the spec (observedGeneration < generation) is Progressing too.
local hs = { status = "Progressing", message = "waiting for the protobot operator" }
if obj.status == nil or obj.status.conditions == nil then
  return hs
end
local generation = obj.metadata and obj.metadata.generation
local observed = obj.status.observedGeneration
if generation ~= nil and observed ~= nil and observed < generation then
  hs.message = "the operator has not observed generation " .. tostring(generation) .. " yet"
  return hs
end
local ready = nil
local stalled = nil
for _, condition in ipairs(obj.status.conditions) do
  if condition.type == "Ready" then
    ready = condition
  elseif condition.type == "Stalled" then
    stalled = condition
  end
end
local function describe(condition)
  local text = condition.reason or ""
  if condition.message ~= nil and condition.message ~= "" then
    text = text .. ": " .. condition.message
  end
  return text
end
if stalled ~= nil and stalled.status == "True" then
  hs.status = "Degraded"
  hs.message = describe(stalled)
  return hs
end
if ready ~= nil and ready.status == "True" then
  hs.status = "Healthy"
  hs.message = describe(ready)
  return hs
end
if ready ~= nil then
  hs.message = describe(ready)
end
return hs
