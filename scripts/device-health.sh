#!/bin/bash
# On a machine with a real NVIDIA GPU (no Kubernetes needed): run gpuprov's health agent
# (issue 33) from its payload script, as the gpu_health role installs it, against the real GPU
# for about 60 s; print its CPU time and peak RSS and what it concluded.
#   1. build the agent's payload script (gpuprov/payload.py, entry health-agent) here
#   2. one check cycle (--once), timed
#   3. the agent for DURATION seconds (default 60) with a check cycle every INTERVAL seconds
#      (default 10: six cycles; the role's default is 60), following /dev/kmsg where it may
#      read it (without it: the agent says so and still checks)
#   4. its conditions, metrics file, evidence and state
# Python packages the machine lacks (nvidia-ml-py, prometheus_client) may come as wheels in
# .whl/; they go under /tmp/site, nothing system-wide. Everything lands in $OUT.
set -u
OUT=${OUT:-$PWD/device-out}
DURATION=${DURATION:-60}
INTERVAL=${INTERVAL:-10}
mkdir -p "$OUT/state" "$OUT/textfile"
export LC_ALL=C.UTF-8 PYTHONUNBUFFERED=1 GPUPROV_CACHE_DIR=/tmp/gpuprov-cache
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}

echo "== build the agent's payload script"
python3 -c "from gpuprov import payload; open('/tmp/health-agent.py', 'wb').write(payload.node_script('health-agent'))" \
    || { echo "cannot build the payload (nvidia-ml-py and prometheus_client needed)"; exit 2; }
ls -l /tmp/health-agent.py
cat >"$OUT/health.json" <<EOF
{"node_name": "$(hostname -s 2>/dev/null || echo device)", "state_dir": "$OUT/state",
 "textfile_dir": "$OUT/textfile", "interval_s": $INTERVAL, "kmsg": "/dev/kmsg",
 "settings": {"gpu_expected": true}}
EOF
echo "kmsg readable: $(test -r /dev/kmsg && echo yes || echo no)"

# The agent runs as a child of this Python: its CPU time and peak RSS come from
# getrusage(RUSAGE_CHILDREN), so the measuring costs nothing inside it. The script is run by the
# system's python3 with -I, as the systemd unit runs it (PYTHONPATH is ignored then: the payload
# carries everything).
measure() {
    python3 - "$@" <<'EOF'
import resource, signal, subprocess, sys, time
label, seconds, argv = sys.argv[1], float(sys.argv[2]), sys.argv[3:]
started = time.monotonic()
child = subprocess.Popen(argv)
try:
    child.wait(timeout=seconds)
except subprocess.TimeoutExpired:
    child.send_signal(signal.SIGINT)
    child.wait(timeout=30)
wall = time.monotonic() - started
usage = resource.getrusage(resource.RUSAGE_CHILDREN)
cpu = usage.ru_utime + usage.ru_stime
print(f"{label}: exit {child.returncode}, wall {wall:.1f} s, CPU {cpu:.2f} s "
      f"(user {usage.ru_utime:.2f}, sys {usage.ru_stime:.2f}) = {100 * cpu / wall:.2f} % of a "
      f"core, max RSS {usage.ru_maxrss / 1024:.1f} MiB")
EOF
}

echo "== one check cycle (--once)"
measure once 120 python3 -I /tmp/health-agent.py agent --config "$OUT/health.json" --once
echo "== the agent for $DURATION s, a cycle every $INTERVAL s"
measure "agent ${DURATION}s" "$DURATION" python3 -I /tmp/health-agent.py agent --config "$OUT/health.json" \
    2>"$OUT/agent.log"
tail -20 "$OUT/agent.log"

echo "== what it concluded"
python3 - "$OUT" <<'EOF'
import json, os, sys
out = sys.argv[1]
published = json.load(open(os.path.join(out, "state", "conditions.json")))
for c in published["conditions"]:
    print(f"{c['type']}: {c['status']} ({c['reason']}) {c['message'][:300]}")
state = json.load(open(os.path.join(out, "state", "state.json")))
print("boot", state["boot_id"], "kmsg seq", state["kmsg_seq"], "faults", list(state["faults"]))
print("GPUs (pci -> uuid):", state["uuids"])
print("XID records counted:", state["xid_counts"])
evidence = os.path.join(out, "state", "evidence.jsonl")
print("evidence records:", sum(1 for _ in open(evidence)) if os.path.exists(evidence) else 0)
EOF
grep -E "^gpuprov_health_(check_status|condition|kmsg|last)" "$OUT/textfile/gpuprov_health.prom" \
    | grep -v " 0.0$"
ls -la "$OUT" "$OUT/state"

echo "== where the agent's resident memory goes (one interpreter, step by step)"
# pip installed /tmp/site with --no-compile: compile its bytecode first, so that the steps below
# measure loading bytecode, as the agent does, not the compiler (whose arenas stay: +13 to 17 MiB).
python3 -I -m compileall -q /tmp/site >/dev/null 2>&1
python3 -I - <<'EOF2'
import sys
sys.path.insert(0, "/tmp/site")
def status():
    with open("/proc/self/status") as f:
        return {k: int(v.split()[0]) / 1024 for k, _, v in
                (line.partition(":") for line in f) if k.startswith(("VmRSS", "Rss"))}
def rss():
    s = status()
    return (f"{s['VmRSS']:.1f} MiB (anon {s['RssAnon']:.1f}, file {s['RssFile']:.1f}, "
            f"shmem {s['RssShmem']:.1f})")
print(f"python3 -I: {rss()}")
import json, hashlib, logging, ssl, subprocess, urllib.request  # noqa: E401 the agent's stdlib
print(f"+ stdlib modules (ssl included: the agent's API client): {rss()}")
import pynvml
print(f"+ import pynvml (bytecode): {rss()}")
def mappings():
    out, name = {}, None
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if "-" in head[0] and not head[0].endswith(":"):
                name = head[5] if len(head) > 5 else "[anon]"
            elif head[0] == "Rss:":
                out[name] = out.get(name, 0) + int(head[1])
    return out
before = mappings()
pynvml.nvmlInit()
print(f"+ nvmlInit (libnvidia-ml loaded): {rss()}")
after = mappings()
grown = sorted(((after[k] - before.get(k, 0), k) for k in after), reverse=True)[:8]
print("  nvmlInit's growth by mapping (KiB): "
      + ", ".join(f"{k} +{v}" for v, k in grown if v > 0))
pynvml.nvmlShutdown()
print(f"+ nvmlShutdown (the agent's state between cycles): {rss()}")
import prometheus_client  # noqa: F401
print(f"+ import prometheus_client: {rss()}")
EOF2
