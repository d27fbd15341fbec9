#!/usr/bin/env bash
# Installs promtool into DIR (default .tools) for `make test-alerts`: the binary of Debian's
# `prometheus` package, downloaded with apt and unpacked (nothing is installed system-wide, no
# daemon is set up). Idempotent; a promtool already on PATH is linked instead.
set -euo pipefail
dir=${1:-.tools}
if [ -x "$dir/promtool" ]; then exit 0; fi
mkdir -p "$dir"
if found=$(command -v promtool 2>/dev/null); then
    ln -sf "$found" "$dir/promtool"
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "install-promtool: no apt-get here; install promtool (Prometheus' release archive, or" >&2
    echo "  'go install github.com/prometheus/prometheus/cmd/promtool@latest') and put it on PATH" >&2
    exit 1
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# apt drops privileges to _apt for downloads; it must be able to write the directory.
chmod 0777 "$tmp"
if ! (cd "$tmp" && apt-get download -qq prometheus 2>/dev/null); then
    if [ "$(id -u)" -ne 0 ]; then
        echo "install-promtool: apt-get download prometheus failed; run 'sudo apt-get update' and retry" >&2
        exit 1
    fi
    apt-get update -qq
    (cd "$tmp" && apt-get download -qq prometheus)
fi
dpkg-deb -x "$tmp"/prometheus_*.deb "$tmp/x"
install -m 0755 "$tmp/x/usr/bin/promtool" "$dir/promtool"
"$dir/promtool" --version 2>&1 | head -1
