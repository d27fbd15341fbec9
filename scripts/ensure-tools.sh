#!/usr/bin/env bash
# Makes sure the tools `make demo` / `make test` need are here before any work
# starts: installs what is missing through the system package manager (apt-get,
# as root or with passwordless sudo) or cargo, saying what it runs; otherwise
# stops with the one command to run.
#
# usage: scripts/ensure-tools.sh TOOL...   (TOOL: git, bwrap, nextest)
set -euo pipefail

say() { printf 'ensure-tools: %s\n' "$*" >&2; }

# The command that runs as root here: empty when we are root, `sudo` when it
# works without a password, nothing usable otherwise (exit 1).
as_root() {
    if [ "$(id -u)" = 0 ]; then
        echo ""
    elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
        echo "sudo"
    else
        return 1
    fi
}

apt_install() { # package
    local pkg=$1 root
    if ! command -v apt-get >/dev/null 2>&1; then
        say "$pkg is missing and this machine has no apt-get: install $pkg with your package manager, then run make again"
        exit 1
    fi
    if ! root=$(as_root); then
        say "$pkg is missing: run 'sudo apt-get install -y $pkg', then run make again"
        exit 1
    fi
    say "installing $pkg: ${root:+$root }apt-get update -qq && ${root:+$root }apt-get install -y -qq --no-install-recommends $pkg"
    $root apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $root apt-get install -y -qq --no-install-recommends "$pkg" >/dev/null
}

bwrap_usable() {
    bwrap --ro-bind / / --dev /dev --proc /proc --unshare-all true 2>/dev/null
}

for tool in "$@"; do
    case "$tool" in
    git)
        command -v git >/dev/null 2>&1 || apt_install git
        ;;
    bwrap)
        command -v bwrap >/dev/null 2>&1 || apt_install bubblewrap
        if ! bwrap_usable; then
            if [ -r /proc/sys/kernel/apparmor_restrict_unprivileged_userns ] &&
                [ "$(cat /proc/sys/kernel/apparmor_restrict_unprivileged_userns)" = 1 ]; then
                say "bubblewrap cannot create a sandbox: AppArmor restricts unprivileged user namespaces (Ubuntu 23.10+); run 'sudo sysctl -w kernel.apparmor_restrict_unprivileged_userns=0' (or add an AppArmor profile for bwrap), then run make again"
            else
                say "bubblewrap is installed but cannot create a sandbox here (no user namespaces?): 'bwrap --ro-bind / / true' fails; enable unprivileged user namespaces ('sudo sysctl -w kernel.unprivileged_userns_clone=1'), then run make again"
            fi
            exit 1
        fi
        ;;
    nextest)
        if ! cargo nextest --version >/dev/null 2>&1; then
            say "installing cargo-nextest: cargo install --locked cargo-nextest"
            cargo install --locked cargo-nextest
        fi
        ;;
    *)
        say "unknown tool $tool (known: git, bwrap, nextest)"
        exit 2
        ;;
    esac
done
