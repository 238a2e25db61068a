#!/usr/bin/env bash
# Debian's containerd binaries for the unit tests, one per containerd generation:
# bookworm (1.6), trixie (1.7), unstable (2.x). The tests run `containerd --config FILE
# config dump`, which parses a config without a daemon; installing the package instead
# would start a containerd on this machine. So: a throwaway apt configuration (this
# machine's sources and lists are never touched), `apt-get download`, `dpkg-deb -x`.
# Also the CRI's api.proto from `golang-k8s-cri-api-dev` (unstable): the lab's kubelet
# talks to the nodes' containerd through stubs generated from it (gpuprov/lab/kube/cri.py).
#
#   scripts/fetch-containerd.sh [SUITE...]     (default: bookworm trixie unstable)
#
# Result: <cache>/containerd/<suite>/usr/bin/containerd and <cache>/containerd/cri-api/
# (api.proto under usr/share/gocode/...), <cache> being the machine's gpuprov cache
# (gpuprov/lab/cache.py: GPUPROV_CACHE_DIR, else $XDG_CACHE_HOME/gpuprov, else
# ~/.cache/gpuprov), so that another clone finds them. Already there: nothing is fetched.
# GPUPROV_DEBIAN_MIRROR overrides the archive (default http://deb.debian.org/debian).
set -euo pipefail

MIRROR=${GPUPROV_DEBIAN_MIRROR:-http://deb.debian.org/debian}
KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg
CACHE=${GPUPROV_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/gpuprov}/containerd
SUITES=("$@")
[ ${#SUITES[@]} -gt 0 ] || SUITES=(bookworm trixie unstable)

fail() {
    echo "fetch-containerd: $*" >&2
    exit 1
}

# fetch_deb SUITE PACKAGE DEST: the package's files extracted into DEST (via DEST.tmp).
fetch_deb() {
    local suite=$1 package=$2 dest=$3 work=$CACHE/.apt/$1
    rm -rf "$work" "$dest" "$dest.tmp"
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
    (cd "$work/deb" && "${apt[@]}" download "$package") >>"$log" 2>&1 \
        || fail "$suite: apt-get download $package failed: $(grep -E '^E:' "$log" | head -1)"
    local deb
    deb=$(ls "$work"/deb/"${package}"_*.deb 2>/dev/null | head -1)
    [ -n "$deb" ] || fail "$suite: apt-get download left no $package .deb in $work/deb"
    mkdir -p "$dest.tmp"
    dpkg-deb -x "$deb" "$dest.tmp" || fail "$suite: dpkg-deb -x $deb failed"
    basename "$deb" >"$dest.tmp/DEB"
    rm -rf "$work"
}

fetch() {
    local suite=$1 dest=$CACHE/$1
    # A binary that runs is the cache hit; a half-extracted tree is fetched again.
    if "$dest/usr/bin/containerd" --version >/dev/null 2>&1; then
        echo "containerd $suite: $("$dest/usr/bin/containerd" --version | awk '{print $3}') (cached) $dest/usr/bin/containerd"
        return
    fi
    fetch_deb "$suite" containerd "$dest"
    "$dest.tmp/usr/bin/containerd" --version >/dev/null 2>&1 \
        || fail "$suite: containerd from $(cat "$dest.tmp/DEB") does not run here"
    mv "$dest.tmp" "$dest"
    echo "containerd $suite: $("$dest/usr/bin/containerd" --version | awk '{print $3}') ($(cat "$dest/DEB")) $dest/usr/bin/containerd"
}

fetch_cri_api() {
    local dest=$CACHE/cri-api proto=usr/share/gocode/src/k8s.io/cri-api/pkg/apis/runtime/v1/api.proto
    if [ -s "$dest/$proto" ]; then
        echo "CRI api.proto: (cached) $dest/$proto"
        return
    fi
    fetch_deb unstable golang-k8s-cri-api-dev "$dest"
    [ -s "$dest.tmp/$proto" ] || fail "$(cat "$dest.tmp/DEB") has no $proto"
    mv "$dest.tmp" "$dest"
    echo "CRI api.proto: ($(cat "$dest/DEB")) $dest/$proto"
}

command -v apt-get >/dev/null && command -v dpkg-deb >/dev/null \
    || fail "needs apt-get and dpkg-deb (a Debian or Ubuntu machine)"
[ -r "$KEYRING" ] || fail "$KEYRING missing: apt-get install debian-archive-keyring"
for suite in "${SUITES[@]}"; do
    rm -rf "$CACHE/$suite.tmp"
    fetch "$suite"
done
fetch_cri_api
rmdir "$CACHE/.apt" 2>/dev/null || true
