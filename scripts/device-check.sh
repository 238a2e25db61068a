#!/bin/bash
# On a machine with a real NVIDIA GPU (the device tool's lent machine, or any GPU node with this
# checkout): record what the GPU answers and run gpuprov's node side against it.
#   1. scripts/nvml_truth.py record: NVML's raw answers, the probe report, nvidia-smi -q -x, and
#      their comparison (printed)
#   2. gpuprov verify's node phase on this machine (an inventory with ansible_connection=local)
#   3. the kernel log's records (real NVRM lines), nvidia-smi -q and the machine's facts
# Everything lands in $OUT (default ./device-out). Python packages the machine lacks
# (ansible-core, fabric, tomlkit and theirs) may come as wheels in .whl/ (see the device
# tool's README); they are installed under /tmp/site, nothing system-wide.
set -u
OUT=${OUT:-$PWD/device-out}
mkdir -p "$OUT"
export LC_ALL=C.UTF-8 PYTHONUNBUFFERED=1
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}

echo "== nvml_truth record"
python3 scripts/nvml_truth.py record --out "$OUT"
echo "nvml_truth exit $?"

echo "== verify, node phase, this machine"
cat > /tmp/device-inventory.yml <<EOF
all:
  children:
    gpu_nodes:
      hosts:
        $(hostname -s 2>/dev/null || echo device):
          ansible_connection: local
EOF
python3 -m gpuprov verify -i /tmp/device-inventory.yml --no-pods --json >"$OUT/verify.json"
echo "verify --json exit $?"
python3 -m gpuprov verify -i /tmp/device-inventory.yml --no-pods -v
echo "verify exit $?"
python3 -m gpuprov probe
echo "probe exit $?"

echo "== kernel log, nvidia-smi -q, machine facts"
python3 - >"$OUT/kmsg.txt" <<'EOF'
# Every record /dev/kmsg holds now, as the kernel serves them (one record per read).
import errno, os, sys
fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
while True:
    try:
        record = os.read(fd, 8192)
    except BlockingIOError:
        break
    except OSError as exc:
        if exc.errno == errno.EPIPE:  # overwritten under us: go on from the next
            continue
        raise
    sys.stdout.write(record.decode("utf-8", "replace"))
EOF
echo "kmsg: $(wc -l <"$OUT/kmsg.txt") records, $(grep -ciE 'nvrm|nvidia|xid' "$OUT/kmsg.txt") about NVIDIA"
nvidia-smi -q >"$OUT/nvidia-smi-q.txt" 2>&1
{
    for cmd in "uname -a" "cat /etc/os-release" "cat /proc/driver/nvidia/version" \
        "cat /sys/module/nvidia/version" "ls -l /dev/nvidia* /dev/nvidia-caps" "nvidia-smi -L" \
        "nvidia-smi mig -lgip" "nvidia-smi mig -lgipp" "lsmod" "modinfo nvidia" \
        "nvidia-smi --query-gpu=index,name,pci.bus_id,pci.device_id,pci.sub_device_id,compute_cap,memory.total,memory.reserved,memory.used,memory.free,temperature.gpu,power.draw,enforced.power.limit,persistence_mode,ecc.mode.current,pcie.link.gen.current,pcie.link.gen.max,pcie.link.width.current,pcie.link.width.max,clocks_event_reasons.active,mig.mode.current,driver_version,vbios_version --format=csv" \
        "ls /sys/bus/pci/devices" "cat /proc/cmdline" "systemctl is-system-running" \
        "ls /lib/modules" "ls -l /usr/lib/x86_64-linux-gnu/libnvidia-ml.so*" \
        "ldconfig -p" "python3 -m pip list"; do
        echo "### $cmd"
        timeout 30 bash -c "$cmd" 2>&1 | head -200
    done
    for dev in /sys/bus/pci/devices/*; do
        [ "$(cat "$dev/vendor" 2>/dev/null)" = 0x10de ] || continue
        echo "### $dev"
        for f in vendor device subsystem_vendor subsystem_device class current_link_speed \
            current_link_width max_link_speed max_link_width numa_node driver; do
            printf '%s: %s\n' "$f" "$(cat "$dev/$f" 2>/dev/null || readlink "$dev/$f")"
        done
    done
} >"$OUT/env.txt" 2>&1
ls -la "$OUT"
