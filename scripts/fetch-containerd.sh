#!/usr/bin/env bash
# Debian's containerd binaries for the unit tests, one per containerd generation:
# bookworm (1.6), trixie (1.7), unstable (2.x). The tests run `containerd --config FILE
# config dump`, which parses a config without a daemon; installing the package instead
# would start a containerd on this machine. So: a throwaway apt configuration (this
# machine's sources and lists are never touched), `apt-get download`, `dpkg-deb -x`.
# Also the CRI's api.proto from `golang-k8s-cri-api-dev` (unstable): the lab's kubelet
# talks to the nodes' containerd through stubs generated from it (gpuprov/lab/kube/cri.py);
# gnostic's OpenAPIv2.proto from `golang-github-google-gnostic-models-dev` (unstable): the
# emulated API serves /openapi/v2 in the protobuf form client-go asks for
# (gpuprov/lab/kube/openapi.py); and Debian's real `kubectl` (unstable, source `kubernetes`),
# the client the lab's emulated API is tested with (tests/unit/test_kube_kubectl.py,
# tests/lab/test_lab_kubectl.py). The machine's own kubectl, if any, is not used: it may be any
# version (out of skew with the emulated server), or a vendor's wrapper.
#
#   scripts/fetch-containerd.sh [SUITE...]     (default: bookworm trixie unstable)
#
# Result, in <cache>/containerd/ (<cache> being the machine's gpuprov cache,
# gpuprov/lab/cache.py: GPUPROV_CACHE_DIR, else $XDG_CACHE_HOME/gpuprov, else ~/.cache/gpuprov,
# so that another clone finds them): <suite>/usr/bin/containerd, cri-api/ and gnostic/ (the
# .proto files under usr/share/gocode/...) and kubectl/usr/bin/kubectl.
# Already there: nothing is fetched.
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
    # The machine's installed packages must not pick the version: an installed package of
    # the same name with a higher version (a vendor's `kubectl`, epoch 1:528) would be the
    # candidate, and apt-get download finds it in no source.
    apt+=(-o "Dir::State::status=$work/status")
    : >"$work/status"
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

# fetch_file LABEL PACKAGE FILE DEST: one file of an unstable package (its whole tree, under
# DEST), the cache hit being that file.
fetch_file() {
    local label=$1 package=$2 file=$3 dest=$CACHE/$4
    if [ -s "$dest/$file" ]; then
        echo "$label: (cached) $dest/$file"
        return
    fi
    rm -rf "$dest.tmp"
    fetch_deb unstable "$package" "$dest"
    [ -s "$dest.tmp/$file" ] || fail "$(cat "$dest.tmp/DEB") has no $file"
    mv "$dest.tmp" "$dest"
    echo "$label: ($(cat "$dest/DEB")) $dest/$file"
}

fetch_kubectl() {
    local dest=$CACHE/kubectl bin=usr/bin/kubectl
    if "$dest/$bin" version --client >/dev/null 2>&1; then
        echo "kubectl: $("$dest/$bin" version --client | awk '/^Client Version/ {print $3}') (cached) $dest/$bin"
        return
    fi
    fetch_deb unstable kubectl "$dest"
    "$dest.tmp/$bin" version --client >/dev/null 2>&1 \
        || fail "unstable: kubectl from $(cat "$dest.tmp/DEB") does not run here"
    mv "$dest.tmp" "$dest"
    echo "kubectl: $("$dest/$bin" version --client | awk '/^Client Version/ {print $3}') ($(cat "$dest/DEB")) $dest/$bin"
}

command -v apt-get >/dev/null && command -v dpkg-deb >/dev/null \
    || fail "needs apt-get and dpkg-deb (a Debian or Ubuntu machine)"
[ -r "$KEYRING" ] || fail "$KEYRING missing: apt-get install debian-archive-keyring"
for suite in "${SUITES[@]}"; do
    rm -rf "$CACHE/$suite.tmp"
    fetch "$suite"
done
fetch_file "CRI api.proto" golang-k8s-cri-api-dev \
    usr/share/gocode/src/k8s.io/cri-api/pkg/apis/runtime/v1/api.proto cri-api
fetch_file "OpenAPI v2 proto" golang-github-google-gnostic-models-dev \
    usr/share/gocode/src/github.com/google/gnostic-models/openapiv2/OpenAPIv2.proto gnostic
rm -rf "$CACHE/kubectl.tmp"
fetch_kubectl
rmdir "$CACHE/.apt" 2>/dev/null || true
