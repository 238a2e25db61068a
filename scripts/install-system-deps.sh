#!/usr/bin/env bash
# Install the Debian packages gpuprov's lab and tests need, only if some are missing
# (so repeated `make` runs stay fast). Debian 12, as root.
set -euo pipefail

# podman, runc, debootstrap, uidmap, slirp4netns: the lab's node containers and image;
# openssh-client: reaching the nodes; gcc, libc6-dev: the simulated NVML library;
# python3-venv: the project's virtualenv; dpkg-dev (dpkg-scanpackages), gnupg: the lab's
# signed package repository of the simulated NVIDIA container toolkit (gpuprov/lab/pkgrepo.py);
# pci.ids: the real PCI ID list the hardware tests classify GPUs missing from the table with.
packages=(
  podman runc debootstrap uidmap slirp4netns
  openssh-client gcc libc6-dev python3 python3-venv git make ca-certificates
  dpkg-dev gnupg pci.ids
)

missing=()
for pkg in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)
  [[ $status == "install ok installed" ]] || missing+=("$pkg")
done

if ((${#missing[@]} == 0)); then
  exit 0
fi
if [[ $(id -u) != 0 ]]; then
  echo "install-system-deps: missing packages: ${missing[*]}; run as root or install them" >&2
  exit 2
fi
echo "install-system-deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq "${missing[@]}" >/dev/null
