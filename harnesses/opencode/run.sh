#!/bin/sh
# Reference harness: OpenCode (npm opencode-ai) as Worker A, Worker B or an Inspector
# (docs/worker-harnesses.md).
#
# Reads /task/task.json, runs `opencode run` non-interactively on /workspace with the role's
# instructions. A Worker's changes are committed and the repository copied to /out/worker; an
# Inspector writes /out/findings.jsonl (one finding per line in the Finding Ledger's shape), which
# the harness checks line by line before the Job Site reads it (and never commits anything).
# The model is reached ONLY through the egress proxy ($PROTOBOT_EGRESS_PROXY), with the run's
# session token read from $PROTOBOT_EGRESS_SESSION_TOKEN_FILE by OpenCode itself (a `{file:…}`
# header in its configuration): no API key exists in the sandbox, and the request carries no
# Authorization header, so the credential broker adds the key after its policy decision.
#
# The WorkerClass sets the model through the environment of its command, for example
#   {"command": ["env", "PROTOBOT_MODEL_HOST=api.openai.com", "PROTOBOT_MODEL=gpt-4.1",
#                "/harness/opencode/run.sh"], "egress": true}
#   PROTOBOT_MODEL_HOST       host of an OpenAI-compatible chat-completions API (required)
#   PROTOBOT_MODEL            model id (required)
#   PROTOBOT_MODEL_BASE_PATH  API path prefix on that host (default /v1)
#   PROTOBOT_MODEL_TIMEOUT_MS how long one model request may take (default: OpenCode's own)
#   PROTOBOT_OPENCODE         the opencode binary (default: opencode on PATH)
set -eu

task=${PROTOBOT_TASK:-/task/task.json}
workspace=${PROTOBOT_WORKSPACE:-/workspace}
out=${PROTOBOT_OUT:-/out}
opencode=${PROTOBOT_OPENCODE:-opencode}

fail() {
    echo "opencode harness: $*" >&2
    exit 2
}
[ -n "${PROTOBOT_EGRESS_PROXY:-}" ] || fail "PROTOBOT_EGRESS_PROXY is not set: this harness reaches its model only through the egress proxy; give the worker class \"egress\": true"
[ -r "${PROTOBOT_EGRESS_SESSION_TOKEN_FILE:-}" ] || fail "the egress session token file (PROTOBOT_EGRESS_SESSION_TOKEN_FILE) is missing or unreadable"
[ -n "${PROTOBOT_MODEL_HOST:-}" ] || fail "PROTOBOT_MODEL_HOST is not set: the worker class names the model API's host (e.g. api.openai.com)"
# The task's model (the WorkerClass's model for the attempt's tier, when the class maps tiers to
# models) wins over the class's fixed PROTOBOT_MODEL.
if command -v jq >/dev/null 2>&1 && [ -r "$task" ]; then
    tier_model=$(jq -r '.model.model // empty' "$task")
    [ -z "$tier_model" ] || PROTOBOT_MODEL=$tier_model
fi
[ -n "${PROTOBOT_MODEL:-}" ] || fail "PROTOBOT_MODEL is not set and the task names no model: the worker class names the model"
command -v jq >/dev/null 2>&1 || fail "jq is missing from the image"
command -v git >/dev/null 2>&1 || fail "git is missing from the image"
command -v "$opencode" >/dev/null 2>&1 || fail "opencode ($opencode) is missing from the image; see scripts/install-agents.sh"
base_path=${PROTOBOT_MODEL_BASE_PATH:-/v1}
timeout_ms=${PROTOBOT_MODEL_TIMEOUT_MS:-}
case "$timeout_ms" in
'' | *[!0-9]*) [ -z "$timeout_ms" ] || fail "PROTOBOT_MODEL_TIMEOUT_MS is not a number of milliseconds: $timeout_ms" ;;
esac

role=$(jq -r .role "$task")
work_item=$(jq -r '.work_item_id // "unknown"' "$task")
cycle=$(jq -r '.cycle // 0' "$task")
requirements=$(jq -r '(.requirement_ids // []) | join(", ")' "$task")
feedback=$(jq -c '.feedback // []' "$task")
inspection_run=$(jq -r '.inspection_run_id // ""' "$task")
candidate=$(jq -r '.candidate // ""' "$task")
case "$role" in
inspector)
    instructions="You are an Inspector of candidate $candidate (inspection run $inspection_run). Do not change any file in the workspace. Check that the candidate in the workspace shows every requirement below, its error paths included: run the implementation and its tests yourself. Report every defect as one line of JSON in $out/findings.jsonl with exactly the fields subject (a stable name of what is wrong), category (conformance or coverage), severity (major or minor), requirement_ids (the approved requirement ids it concerns), disposition (implementation-defect, test-defect, both-defective, spec-gap or not-a-defect), paths (the project paths it concerns) and summary (one sentence). When you find no defect, write the file empty."
    ;;
worker-a)
    instructions="You are Worker A. Write automated tests for the requirements below, and only tests: do not write or change the implementation (it is not in your workspace). Each test must check the observable behaviour a requirement states, its error paths included."
    ;;
worker-b)
    instructions="You are Worker B. Implement the requirements below. Do not write or change tests (they are not in your workspace)."
    ;;
*)
    fail "role $role is not supported by this harness (worker-a, worker-b, inspector)"
    ;;
esac
prompt="protobot task: $role for $work_item, cycle $cycle.
Inspection run: ${inspection_run:-none}.
$instructions
The requirements are in the repository's specification files; the files under .protobot/ say which paths your role owns. Never edit .protobot/.
Requirements: $requirements
Feedback from the previous cycle (sanitized): $feedback
Work in $workspace and stop when you are done; the harness commits your changes."

# OpenCode's state and configuration live in the private /tmp, never in the workspace. The
# project's own OpenCode configuration is ignored: the workspace is untrusted input.
state=$(mktemp -d "${TMPDIR:-/tmp}/opencode.XXXXXX")
export HOME="$state/home" XDG_CONFIG_HOME="$state/config" XDG_DATA_HOME="$state/data" \
    XDG_CACHE_HOME="$state/cache" XDG_STATE_HOME="$state/state"
mkdir -p "$HOME" "$XDG_CONFIG_HOME" "$XDG_DATA_HOME" "$XDG_CACHE_HOME" "$XDG_STATE_HOME"
export OPENCODE_CONFIG="$state/opencode.json" OPENCODE_DISABLE_PROJECT_CONFIG=1 \
    OPENCODE_DISABLE_MODELS_FETCH=1 OPENCODE_DISABLE_AUTOUPDATE=1 OPENCODE_DISABLE_DEFAULT_PLUGINS=1 \
    OPENCODE_DISABLE_LSP_DOWNLOAD=1 OPENCODE_DISABLE_SHARE=1 OPENCODE_DISABLE_CLAUDE_CODE=1 \
    OPENCODE_DISABLE_EXTERNAL_SKILLS=1
# No "apiKey": the openai-compatible provider then sends no Authorization header (the proxy
# refuses requests that carry one). The session token header is read from its file by OpenCode.
# external_directory is allowed because the sandbox, not OpenCode, is the boundary: only
# /workspace, /out and the private /tmp are writable, and the agent may read /task.
jq -n \
    --arg base "${PROTOBOT_EGRESS_PROXY%/}/$PROTOBOT_MODEL_HOST$base_path" \
    --arg token "{file:$PROTOBOT_EGRESS_SESSION_TOKEN_FILE}" \
    --arg model "$PROTOBOT_MODEL" \
    --arg timeout "$timeout_ms" \
    '{
      "$schema": "https://opencode.ai/config.json",
      autoupdate: false,
      share: "disabled",
      lsp: false,
      formatter: false,
      provider: {protobot: {
        npm: "@ai-sdk/openai-compatible",
        name: "protobot (through the egress proxy)",
        options: ({baseURL: $base, headers: {"X-Sandbox-Session-Token": $token}}
                  + (if $timeout == "" then {} else {timeout: ($timeout | tonumber)} end)),
        models: {($model): {name: $model, tool_call: true}}
      }},
      model: ("protobot/" + $model),
      small_model: ("protobot/" + $model),
      permission: {edit: "allow", bash: "allow", webfetch: "deny", external_directory: "allow"}
    }' > "$OPENCODE_CONFIG"

cd "$workspace"
# --format json: one JSON event per line on stdout; an error event keeps the model API's answer
# (statusCode), which the plain output and the logs do not.
"$opencode" run --print-logs --format json "$prompt" > "$state/opencode.out" 2> "$state/opencode.log" || {
    rc=$?
    tail -n 40 "$state/opencode.log" >&2
    # OpenCode retries a failing model request itself (honouring retry-after) before it stops.
    # When it stopped on the model API (an HTTP error, a timeout, no connection), say so in
    # $out/model-failure.json: the Job Site then retries on the same tier after a backoff
    # (429, 408, 5xx, timeouts, connections) or stops the build naming the status (401, 404…)
    # instead of escalating the agent (docs/worker-harnesses.md).
    failure=$(jq -R -s -c '
        [split("\n")[] | fromjson? | select(type == "object" and .type == "error") | .error] | last
        | select(type == "object")
        | if (.data.statusCode | type) == "number" then {status: .data.statusCode}
          elif ((.data.message // "") | test("timed? ?out"; "i")) or .name == "TimeoutError" then {error: "timeout"}
          elif .name == "APIError" and .data.isRetryable == true then {error: "connection"}
          else empty end' "$state/opencode.out" 2>/dev/null || true)
    if [ -n "$failure" ]; then
        printf '%s\n' "$failure" > "$out/model-failure.json"
        fail "opencode exited with $rc: its model request failed ($failure)"
    fi
    fail "opencode exited with $rc"
}
jq -R -r 'fromjson? | select(.type == "text") | .part.text // empty' "$state/opencode.out" | tail -n 5

if [ "$role" = inspector ]; then
    # The findings must be in the ledger's shape: the Job Site refuses the whole report for
    # one bad line, so say which line here, where the agent's output is still at hand.
    [ -f "$out/findings.jsonl" ] || fail "the Inspector wrote no $out/findings.jsonl (an inspection that finds nothing writes it empty)"
    n=0
    while IFS= read -r line || [ -n "$line" ]; do
        n=$((n + 1))
        [ -n "$(printf '%s' "$line" | tr -d '[:space:]')" ] || continue
        printf '%s\n' "$line" | jq -e '
            type == "object"
            and (keys - ["subject","category","severity","requirement_ids","disposition","paths","summary"] == [])
            and (.subject | type == "string" and length > 0)
            and (.category | type == "string") and (.severity | type == "string")
            and (.disposition | IN("implementation-defect","test-defect","both-defective","test-gap","omitted-applicable","spec-gap","not-a-defect","equivalent","tooling-invalid"))
            and ((.requirement_ids // []) | type == "array" and all(type == "string"))
            and ((.paths // []) | type == "array" and all(type == "string"))
            and ((.summary // "") | type == "string")' >/dev/null 2>&1 ||
            fail "line $n of $out/findings.jsonl is not a finding in the ledger's shape (subject, category, severity, requirement_ids, disposition, paths, summary)"
    done < "$out/findings.jsonl"
    echo "opencode harness: $n finding lines for inspection run $inspection_run"
    exit 0
fi

git add -A -- . ':!.protobot'
git -c user.name=opencode -c user.email=opencode@worker.invalid commit -qm "opencode: $role for $work_item, cycle $cycle" || true
cp -a "$workspace" "$out/worker"
