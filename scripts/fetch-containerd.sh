#!/usr/bin/env bash
# Debian's containerd binaries for the unit tests, one per containerd generation:
# bookworm (1.6), trixie (1.7), unstable (2.x). The tests run `containerd --config FILE
# config dump`, which parses a config without a daemon; installing the package instead
# would start a containerd on this machine. So: a throwaway apt configuration (this
# machine's sources and lists are never touched), `apt-get download`, `dpkg-deb -x`.
#
#   scripts/fetch-containerd.sh [SUITE...]     (default: bookworm trixie unstable)
#
# Result: .cache/containerd/<suite>/usr/bin/containerd. Already there: nothing is fetched.
# GPUPROV_DEBIAN_MIRROR overrides the archive (default http://deb.debian.org/debian).
set -euo pipefail

MIRROR=${GPUPROV_DEBIAN_MIRROR:-http://deb.debian.org/debian}
KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg
CACHE=$(cd "$(dirname "$0")/.." && pwd)/.cache/containerd
SUITES=("$@")
[ ${#SUITES[@]} -gt 0 ] || SUITES=(bookworm trixie unstable)

fail() {
    echo "fetch-containerd: $*" >&2
    exit 1
}

fetch() {
    local suite=$1 dest=$CACHE/$1 work=$CACHE/.apt/$1
    # A binary that runs is the cache hit; a half-extracted tree is fetched again.
    if "$dest/usr/bin/containerd" --version >/dev/null 2>&1; then
        echo "containerd $suite: $("$dest/usr/bin/containerd" --version | awk '{print $3}') (cached) $dest/usr/bin/containerd"
        return
    fi
    rm -rf "$work" "$dest"
    mkdir -p "$work/lists/partial" "$work/cache/archives/partial" "$work/deb"
    echo "deb [signed-by=$KEYRING] $MIRROR $suite main" >"$work/sources.list"
    local apt=(apt-get -q
        -o "Dir::Etc::sourcelist=$work/sources.list" -o "Dir::Etc::sourceparts=-"
        -o "Dir::State::Lists=$work/lists" -o "Dir::Cache=$work/cache"
        -o "Dir::Etc::preferences=/dev/null" -o "Dir::Etc::preferencesparts=-"
        -o "APT::Sandbox::User=root")
    local log=$work/apt.log
    # apt-get update exits 0 when an index cannot be fetched; its log says so.
    if ! "${apt[@]}" update >"$log" 2>&1 || grep -qE '^(E|W): Failed to fetch' "$log"; then
        fail "$suite: apt-get update from $MIRROR failed: $(grep -E '^(E|W):' "$log" | head -1)"
    fi
    (cd "$work/deb" && "${apt[@]}" download containerd) >>"$log" 2>&1 \
        || fail "$suite: apt-get download containerd failed: $(grep -E '^E:' "$log" | head -1)"
    local deb
    deb=$(ls "$work"/deb/containerd_*.deb 2>/dev/null | head -1)
    [ -n "$deb" ] || fail "$suite: apt-get download left no containerd .deb in $work/deb"
    mkdir -p "$dest.tmp"
    dpkg-deb -x "$deb" "$dest.tmp" || fail "$suite: dpkg-deb -x $deb failed"
    "$dest.tmp/usr/bin/containerd" --version >/dev/null 2>&1 \
        || fail "$suite: $dest/usr/bin/containerd from $(basename "$deb") does not run here"
    basename "$deb" >"$dest.tmp/DEB"
    mv "$dest.tmp" "$dest"
    rm -rf "$work"
    echo "containerd $suite: $("$dest/usr/bin/containerd" --version | awk '{print $3}') ($(cat "$dest/DEB")) $dest/usr/bin/containerd"
}

command -v apt-get >/dev/null && command -v dpkg-deb >/dev/null \
    || fail "needs apt-get and dpkg-deb (a Debian or Ubuntu machine)"
[ -r "$KEYRING" ] || fail "$KEYRING missing: apt-get install debian-archive-keyring"
for suite in "${SUITES[@]}"; do
    rm -rf "$CACHE/$suite.tmp"
    fetch "$suite"
done
rmdir "$CACHE/.apt" 2>/dev/null || true
