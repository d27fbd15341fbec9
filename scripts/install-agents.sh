#!/usr/bin/env bash
# Installs the agent CLIs the reference harnesses (harnesses/) and their tests use, at PINNED
# versions, into .tools/agents (git-ignored). Idempotent: a matching install is kept.
#   scripts/install-agents.sh            # installs OpenCode and Claude Code
#   PROTOBOT_AGENTS_DIR=/opt/agents scripts/install-agents.sh
# Afterwards: .tools/agents/bin/opencode and .tools/agents/bin/claude (symlinks to the platform
# binaries, which need no Node).
set -euo pipefail
cd "$(dirname "$0")/.."

# Pinned: the harness and its test are checked against this version (docs/worker-harnesses.md).
OPENCODE_VERSION=1.18.33
CLAUDE_CODE_VERSION=2.1.332

dir=${PROTOBOT_AGENTS_DIR:-$PWD/.tools/agents}
mkdir -p "$dir/bin"
command -v npm >/dev/null 2>&1 || {
    echo "install-agents: npm was not found; install Node.js and npm (apt-get install -y nodejs npm)" >&2
    exit 1
}

have=$("$dir/bin/opencode" --version 2>/dev/null || true)
if [ "$have" != "$OPENCODE_VERSION" ]; then
    npm install --no-audit --no-fund --loglevel=error --prefix "$dir/npm" "opencode-ai@$OPENCODE_VERSION"
    # The npm package's launcher is a Node script that finds the platform package
    # (opencode-linux-x64 and similar); link the native binary itself so the sandbox needs no Node.
    native=$(find "$dir/npm/node_modules" -path '*/opencode-linux-*/bin/opencode' -type f | sort | head -1)
    if [ -z "$native" ]; then
        echo "install-agents: opencode-ai@$OPENCODE_VERSION has no Linux binary package for this machine ($(uname -m))" >&2
        exit 1
    fi
    ln -sf "$native" "$dir/bin/opencode"
    have=$("$dir/bin/opencode" --version)
    [ "$have" = "$OPENCODE_VERSION" ] || {
        echo "install-agents: installed opencode reports version $have, expected $OPENCODE_VERSION" >&2
        exit 1
    }
fi
echo "opencode $have: $dir/bin/opencode"

# Claude Code: the npm package's install script copies the platform binary
# (@anthropic-ai/claude-code-linux-x64 and similar) over its launcher; link the platform
# package's binary itself, which does not depend on that script having run.
have=$("$dir/bin/claude" --version 2>/dev/null || true)
if [ "$have" != "$CLAUDE_CODE_VERSION (Claude Code)" ]; then
    npm install --no-audit --no-fund --loglevel=error --prefix "$dir/npm" "@anthropic-ai/claude-code@$CLAUDE_CODE_VERSION"
    # glibc before musl: npm may have installed both where it cannot tell the C library.
    native=$(find "$dir/npm/node_modules/@anthropic-ai" -path '*/claude-code-linux-*/claude' -type f | sort | { grep -v -- '-musl/' || true; } | head -1)
    [ -n "$native" ] || native=$(find "$dir/npm/node_modules/@anthropic-ai" -path '*/claude-code-linux-*/claude' -type f | sort | head -1)
    if [ -z "$native" ]; then
        echo "install-agents: @anthropic-ai/claude-code@$CLAUDE_CODE_VERSION has no Linux binary package for this machine ($(uname -m))" >&2
        exit 1
    fi
    ln -sf "$native" "$dir/bin/claude"
    have=$("$dir/bin/claude" --version)
    [ "$have" = "$CLAUDE_CODE_VERSION (Claude Code)" ] || {
        echo "install-agents: installed claude reports version $have, expected $CLAUDE_CODE_VERSION" >&2
        exit 1
    }
fi
echo "claude $have: $dir/bin/claude"
