"""Benchmark: the health agent as site.yml installed it on a lab node (issue 33's budget is set
on gpu-hopper: 0.5 % of one core over 10 minutes, 40 MiB resident).

Reads the agent's own process in the node, over SSH, at the start and the end of --seconds:
its CPU time (utime + stime of /proc/PID/stat, the service's main process), its resident
memory now and at its peak (VmRSS, VmHWM of /proc/PID/status). The node's python3 is the one
the agent runs on (Debian 13's 3.13 on gpu-hopper, another minor version than a Debian 12
controller's: the agent's bytecode cache is what keeps it small there).

    .venv/bin/gpuprov lab up && ansible-playbook -i inventory/lab/hosts.yml site.yml
    .venv/bin/python bench/health_agent_lab.py [--node gpu-hopper] [--seconds 600]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

from gpuprov.lab.lab import Lab

READ = ("pid=$(systemctl show -p MainPID --value gpuprov-health-agent); "
        "echo $pid; cut -d' ' -f14,15 /proc/$pid/stat; getconf CLK_TCK; "
        "grep -E '^(VmRSS|VmHWM)' /proc/$pid/status; python3 -V")


def sample(lab: Lab, node: str) -> dict:
    out = subprocess.run(lab.ssh_command(lab.require().node(node), READ), capture_output=True,
                         text=True, timeout=60, check=True).stdout.split("\n")
    utime, stime = (int(x) for x in out[1].split())
    ticks = int(out[2])
    mem = {line.split(":")[0]: int(line.split()[1]) / 1024 for line in out[3:5]}
    return {"pid": int(out[0]), "cpu_s": (utime + stime) / ticks, "rss": mem["VmRSS"],
            "hwm": mem["VmHWM"], "python": out[5].strip(), "at": time.monotonic()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--node", default="gpu-hopper")
    parser.add_argument("--seconds", type=float, default=600)
    parser.add_argument("--project", type=Path, default=Path.cwd(),
                        help="the checkout whose lab to read (default: here)")
    args = parser.parse_args()
    lab = Lab(args.project)
    first = sample(lab, args.node)
    time.sleep(args.seconds)
    last = sample(lab, args.node)
    if last["pid"] != first["pid"]:
        print(f"the agent restarted during the window (pid {first['pid']} -> {last['pid']})")
        return 1
    wall = last["at"] - first["at"]
    cpu = last["cpu_s"] - first["cpu_s"]
    print(f"{args.node} ({first['python']}): agent pid {first['pid']}, {wall:.0f} s: CPU "
          f"{cpu:.2f} s = {100 * cpu / wall:.3f} % of one core (budget 0.5 %); resident "
          f"{last['rss']:.1f} MiB now, {last['hwm']:.1f} MiB at its peak (budget 40 MiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
