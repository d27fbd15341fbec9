-- Argo CD health check for protobot.dev/BuildWorkItem (docs/gitops.md): register it in argocd-cm
-- as resource.customizations.health.protobot.dev_BuildWorkItem. The lifecycle state decides:
-- completed is Healthy; blocked (waiting for a person's specification, impact or policy
-- decision) is Suspended; abandoned is Degraded; waiting, ready-for-building, building,
-- inspecting and merging are Progressing. A Ready condition, when the operator writes one,
-- refines the message.
local hs = { status = "Progressing", message = "not materialized yet" }
if obj.status == nil or obj.status.state == nil then
  return hs
end
local state = obj.status.state
local ready = nil
local blocked = nil
if obj.status.conditions ~= nil then
  for _, condition in ipairs(obj.status.conditions) do
    if condition.type == "Ready" then
      ready = condition
    elseif condition.type == "Blocked" then
      blocked = condition
    end
  end
end
local function describe(condition, fallback)
  if condition ~= nil and condition.message ~= nil and condition.message ~= "" then
    return condition.message
  end
  return fallback
end
if state == "completed" then
  hs.status = "Healthy"
  local merge = obj.status.mergeCommit
  hs.message = describe(ready, merge and ("merged as " .. merge) or "completed")
elseif state == "blocked" then
  hs.status = "Suspended"
  hs.message = "blocked: " .. (obj.status.blockReason or describe(blocked, "waiting for a decision"))
elseif state == "abandoned" then
  hs.status = "Degraded"
  hs.message = "abandoned: " .. describe(ready, "the item will not be built")
else
  hs.message = describe(ready, state)
end
return hs
