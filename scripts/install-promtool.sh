#!/usr/bin/env bash
# Installs promtool and prometheus into DIR (default .tools): promtool for `make test-alerts`,
# the server for the real-node scenario that scrapes the operator's pods
# (operator/cli/tests/real_node.rs). The binaries of Debian's `prometheus` package, downloaded
# with apt and unpacked (nothing is installed system-wide, no daemon is set up). Idempotent;
# binaries already on PATH are linked instead.
set -euo pipefail
dir=${1:-.tools}
if [ -x "$dir/promtool" ] && [ -x "$dir/prometheus" ]; then exit 0; fi
mkdir -p "$dir"
if found=$(command -v promtool 2>/dev/null) && server=$(command -v prometheus 2>/dev/null); then
    ln -sf "$found" "$dir/promtool"
    ln -sf "$server" "$dir/prometheus"
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
install -m 0755 "$tmp/x/usr/bin/prometheus" "$dir/prometheus"
"$dir/promtool" --version 2>&1 | head -1
