#!/bin/sh
# Reference harness: Claude Code (npm @anthropic-ai/claude-code) as Worker A, Worker B or an
# Inspector (docs/worker-harnesses.md).
#
# Reads /task/task.json, runs `claude -p` non-interactively on /workspace with the role's
# instructions. A Worker's changes are committed and the repository copied to /out/worker; an
# Inspector writes /out/findings.jsonl (one finding per line in the Finding Ledger's shape), which
# the harness checks line by line before the Job Site reads it (and never commits anything).
# The model is reached ONLY through the egress proxy ($PROTOBOT_EGRESS_PROXY): Claude Code's
# ANTHROPIC_BASE_URL is the proxy's path for the model host, and the run's session token is its
# one extra header. No API key exists in the sandbox: Claude Code insists on having one, so it
# gets a fixed placeholder (PLACEHOLDER_KEY below, sent as `x-api-key`) that authorizes nothing;
# it never sends `Authorization` (which the proxy refuses), and the credential broker adds the
# model credential after its policy decision.
#
# The WorkerClass sets the model through the environment of its command, for example
#   {"command": ["env", "PROTOBOT_MODEL_HOST=llm-gateway.example.com",
#                "PROTOBOT_MODEL=claude-sonnet-4-5", "/harness/claude-code/run.sh"], "egress": true}
#   PROTOBOT_MODEL_HOST       host of an Anthropic Messages API (required)
#   PROTOBOT_MODEL            model id (required unless /task/task.json has {"model": {"model": …}},
#                             which wins: the model of the attempt's tier)
#   PROTOBOT_MODEL_BASE_PATH  path prefix on that host before /v1/messages (default: none)
#   PROTOBOT_MODEL_TIMEOUT_MS how long one model request may take (default: Claude Code's own)
#   PROTOBOT_MODEL_RETRIES    how often Claude Code retries a failed model request before it
#                             stops (default: its own, 10); the Job Site retries the run after
#                             a backoff of its own when the harness reports the failure
#   PROTOBOT_CLAUDE           the claude binary (default: claude on PATH)
set -eu

task=${PROTOBOT_TASK:-/task/task.json}
workspace=${PROTOBOT_WORKSPACE:-/workspace}
out=${PROTOBOT_OUT:-/out}
claude=${PROTOBOT_CLAUDE:-claude}
# Not a secret: it only satisfies Claude Code's check that a key is configured.
PLACEHOLDER_KEY=protobot-placeholder-the-egress-broker-holds-the-key

fail() {
    echo "claude-code harness: $*" >&2
    exit 2
}
[ -n "${PROTOBOT_EGRESS_PROXY:-}" ] || fail "PROTOBOT_EGRESS_PROXY is not set: this harness reaches its model only through the egress proxy; give the worker class \"egress\": true"
[ -r "${PROTOBOT_EGRESS_SESSION_TOKEN_FILE:-}" ] || fail "the egress session token file (PROTOBOT_EGRESS_SESSION_TOKEN_FILE) is missing or unreadable"
[ -n "${PROTOBOT_MODEL_HOST:-}" ] || fail "PROTOBOT_MODEL_HOST is not set: the worker class names the model API's host (e.g. api.anthropic.com)"
# The task's model (the WorkerClass's model for the attempt's tier, when the class maps tiers to
# models) wins over the class's fixed PROTOBOT_MODEL.
if command -v jq >/dev/null 2>&1 && [ -r "$task" ]; then
    tier_model=$(jq -r '.model.model // empty' "$task")
    [ -z "$tier_model" ] || PROTOBOT_MODEL=$tier_model
fi
[ -n "${PROTOBOT_MODEL:-}" ] || fail "PROTOBOT_MODEL is not set and the task names no model: the worker class names the model"
command -v jq >/dev/null 2>&1 || fail "jq is missing from the image"
command -v git >/dev/null 2>&1 || fail "git is missing from the image"
command -v "$claude" >/dev/null 2>&1 || fail "claude ($claude) is missing from the image; see scripts/install-agents.sh"
base_path=${PROTOBOT_MODEL_BASE_PATH:-}
timeout_ms=${PROTOBOT_MODEL_TIMEOUT_MS:-}
case "$timeout_ms" in
'' | *[!0-9]*) [ -z "$timeout_ms" ] || fail "PROTOBOT_MODEL_TIMEOUT_MS is not a number of milliseconds: $timeout_ms" ;;
esac
retries=${PROTOBOT_MODEL_RETRIES:-}
case "$retries" in
'' | *[!0-9]*) [ -z "$retries" ] || fail "PROTOBOT_MODEL_RETRIES is not a number: $retries" ;;
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

# Claude Code's state and configuration live in the private /tmp, never in the workspace; no
# credential of the host or of another tool is inherited.
state=$(mktemp -d "${TMPDIR:-/tmp}/claude-code.XXXXXX")
export HOME="$state/home" XDG_CONFIG_HOME="$state/config" XDG_DATA_HOME="$state/data" \
    XDG_CACHE_HOME="$state/cache" XDG_STATE_HOME="$state/state" CLAUDE_CONFIG_DIR="$state/claude"
mkdir -p "$HOME" "$XDG_CONFIG_HOME" "$XDG_DATA_HOME" "$XDG_CACHE_HOME" "$XDG_STATE_HOME" \
    "$CLAUDE_CONFIG_DIR"
unset ANTHROPIC_AUTH_TOKEN CLAUDE_CODE_OAUTH_TOKEN ANTHROPIC_CUSTOM_HEADERS \
    CLAUDE_CODE_USE_BEDROCK CLAUDE_CODE_USE_VERTEX CLAUDE_CODE_USE_FOUNDRY
# Telemetry, error reports, update checks and every other non-essential request are off; the
# sandbox has no route for them anyway, this keeps Claude Code from trying.
export CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 DISABLE_TELEMETRY=1 DISABLE_ERROR_REPORTING=1 \
    DISABLE_AUTOUPDATER=1 DISABLE_BUG_COMMAND=1 DISABLE_COST_WARNINGS=1 \
    CLAUDE_CODE_DISABLE_FEEDBACK_SURVEY=1 CLAUDE_CODE_IDE_SKIP_AUTO_INSTALL=1
export ANTHROPIC_BASE_URL="${PROTOBOT_EGRESS_PROXY%/}/$PROTOBOT_MODEL_HOST$base_path"
export ANTHROPIC_API_KEY="$PLACEHOLDER_KEY"
[ -z "$timeout_ms" ] || export API_TIMEOUT_MS="$timeout_ms"
[ -z "$retries" ] || export CLAUDE_CODE_MAX_RETRIES="$retries"
ANTHROPIC_CUSTOM_HEADERS="X-Sandbox-Session-Token: $(cat "$PROTOBOT_EGRESS_SESSION_TOKEN_FILE")"
export ANTHROPIC_CUSTOM_HEADERS
# The sandbox, not Claude Code, is the boundary: only /workspace, /out and the private /tmp are
# writable. The shell and file tools are allowed without prompts; the web tools are denied.
jq -n '{
  permissions: {
    allow: ["Bash", "Edit", "Read"],
    deny: ["WebFetch", "WebSearch"]
  },
  includeCoAuthoredBy: false
}' > "$state/settings.json"

cd "$workspace"
# --bare: no hooks, plugins, CLAUDE.md discovery or background prefetches, and auth strictly from
# ANTHROPIC_API_KEY; --setting-sources user: the project's own .claude/ settings are ignored
# (the workspace is untrusted input). Under --bare Claude Code offers Bash, Edit (which also
# creates a file, given an empty old_string) and Read. An Inspector writes its findings outside
# the workspace, so $out is one more directory its tools may use.
set --
[ "$role" != inspector ] || set -- --add-dir "$out"
rc=0
"$claude" -p "$prompt" --bare --model "$PROTOBOT_MODEL" \
    --settings "$state/settings.json" --setting-sources user --strict-mcp-config \
    --permission-mode acceptEdits --tools "Bash,Edit,Read" \
    --allowedTools "Bash Edit Read" --disallowedTools "WebFetch WebSearch" "$@" \
    --no-session-persistence --output-format json \
    > "$state/claude.json" 2> "$state/claude.log" || rc=$?
if [ "$rc" -ne 0 ] || ! jq -e '.is_error == false' "$state/claude.json" >/dev/null 2>&1; then
    tail -n 40 "$state/claude.log" >&2
    head -c 4000 "$state/claude.json" >&2
    # Claude Code retries a failing model request itself (CLAUDE_CODE_MAX_RETRIES, honouring
    # retry-after) before it stops. When it stopped on the model API (an HTTP error, a timeout,
    # no connection), say so in $out/model-failure.json: the Job Site then retries on the same
    # tier after a backoff (429, 408, 5xx, 529, timeouts, connections) or stops the build naming
    # the status (401, 404…) instead of escalating the agent (docs/worker-harnesses.md).
    failure=$(jq -c '
        select(type == "object" and .terminal_reason == "api_error")
        | if (.api_error_status | type) == "number" then {status: .api_error_status}
          elif ((.result // "") | test("timed? ?out|ETIMEDOUT"; "i")) then {error: "timeout"}
          elif ((.result // "") | test("connect|ECONN|socket|network"; "i")) then {error: "connection"}
          else empty end' "$state/claude.json" 2>/dev/null || true)
    if [ -n "$failure" ]; then
        printf '%s\n' "$failure" > "$out/model-failure.json"
        fail "claude exited with $rc: its model request failed ($failure)"
    fi
    fail "claude exited with $rc or reported an error"
fi
jq -r '.result // ""' "$state/claude.json" | tail -n 5

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
    echo "claude-code harness: $n finding lines for inspection run $inspection_run"
    exit 0
fi

git add -A -- . ':!.protobot'
git -c user.name=claude-code -c user.email=claude-code@worker.invalid commit -qm "claude-code: $role for $work_item, cycle $cycle" || true
cp -a "$workspace" "$out/worker"
