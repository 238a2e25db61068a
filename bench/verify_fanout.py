#!/usr/bin/env python3
"""Benchmark: `gpuprov verify`'s node phase fan-out against the same probe run two other ways.

In one run, for the 4 lab nodes and for 64 inventory hosts mapped onto them (16 per node,
each reached on its node's published SSH port):
    verify    `gpuprov verify --no-pods --checks <node-phase families>` (a process, as admins
              run it: Python start-up, inventory through Ansible, fabric, checks, report)
    ssh       plain OpenSSH, one `ssh host python3 -I - < probe` per host, all in parallel:
              the floor for running this probe everywhere
    ansible   `ansible -m script` with the probe, default forks (5), as an Ansible-only
              verification would run it
    connect   plain OpenSSH running only `true` on every host in parallel: the connection cost
              that every SSH-based method pays, probe or not
Each figure comes with the CPU time the whole machine spent meanwhile (/proc/stat; the lab's
nodes are containers on this machine, so their sshd and probe count too): where that is
wall time x cores, the run was CPU-bound, and the ratio says which way costs less CPU
rather than which waits less.
Each figure also comes with the CPU time of the controller's own process tree (rusage of the
verify or ansible process and every child it waited for: the nodes' sshd and probe are not
in it), which is what a CI runner or an admin's laptop pays per host. verify reads the probe
script from the user's cache (gpuprov/payload.py), which the bench's own build of it fills
before the first run: every run but the first after a change of gpuprov does the same (the
first builds it, 0.08 CPU-s more).
Then the cluster phase against the emulated API with 4 and with 1004 nodes: the number of
API requests it makes (goal: the same for both) and its time.

    .venv/bin/python bench/verify_fanout.py [-i inventory/lab/hosts.yml] [--rounds N]

Without -i it brings up a lab of its own in a temporary directory and removes it after.
Last lines: the 64-host runs' controller CPU per host and `verify_cpu/ansible_cpu=X.XX`, then
verify/ssh=X.XX verify/ansible=Y.YY (times of the 64-host runs; goals: <= 1.5 and <= 0.10,
i.e. at least 10x faster than Ansible).
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from gpuprov import payload
from gpuprov.lab.kube.testing import default_lab_backend, running_emulator
from gpuprov.verify import checks as _registered  # noqa: F401 (fills CHECKS)
from gpuprov.verify import cluster
from gpuprov.verify.findings import CHECKS

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
NODE_FAMILIES = sorted({c.split(".")[0] for c, spec in CHECKS.items() if spec.phase == "node"})
assert NODE_FAMILIES, "no node-phase checks registered"


def busy_cpu_seconds() -> float:
    """CPU time this machine has spent busy since boot, all cores (proc(5): /proc/stat)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle, iowait
    return (sum(fields) - idle) / os.sysconf("SC_CLK_TCK")


def children_cpu_seconds() -> float:
    """User + system CPU of every child process this one has waited for, and of their waited
    for descendants (getrusage(2) RUSAGE_CHILDREN): a run's delta is its process tree's."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def measured(func, *args) -> tuple[float, float, float]:
    """(wall seconds, busy CPU seconds of the machine, CPU seconds of the controller's process
    tree) of func(*args), which returns its own wall time and waits for its processes."""
    before, tree = busy_cpu_seconds(), children_cpu_seconds()
    wall = func(*args)
    return wall, busy_cpu_seconds() - before, children_cpu_seconds() - tree


def lab_hosts(inventory: Path) -> tuple[dict, dict[str, dict]]:
    doc = yaml.safe_load(inventory.read_text())
    hosts: dict[str, dict] = {}
    for group in doc["all"]["children"]["k8s_cluster"]["children"].values():
        hosts.update(group.get("hosts") or {})
    return doc["all"]["vars"], hosts


def write_inventory(path: Path, common: dict, hosts: dict[str, dict]) -> Path:
    doc = {"all": {"vars": common, "children": {"k8s_cluster": {"children": {
        "gpu_nodes": {"hosts": hosts}}}}}}
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def mapped(hosts: dict[str, dict], count: int) -> dict[str, dict]:
    """`count` inventory hosts spread over the lab nodes' SSH ports."""
    ports = [h["ansible_port"] for h in hosts.values()]
    return {f"host-{i:02d}": {"ansible_port": ports[i % len(ports)]} for i in range(count)}


def time_verify(inventory: Path) -> float:
    start = time.monotonic()
    proc = subprocess.run(
        [str(BIN / "gpuprov"), "verify", "-i", str(inventory), "--no-pods", "--json",
         "--concurrency", "64", "--checks", ",".join(NODE_FAMILIES)],
        capture_output=True, text=True)
    elapsed = time.monotonic() - start
    if proc.returncode not in (0, 1):  # 1: a check failed (e.g. runtime on a bare lab): fine
        raise SystemExit(f"verify exited {proc.returncode}: {proc.stderr[-2000:]}")
    return elapsed


def time_ssh(common: dict, hosts: dict[str, dict], script: bytes | None) -> float:
    """Plain OpenSSH to every host in parallel: the probe on stdin, or with script None only
    `true` (the connection alone: what any SSH-based check pays per host)."""
    args = ["ssh", "-i", common["ansible_ssh_private_key_file"], "-o", "BatchMode=yes",
            *common["ansible_ssh_common_args"].split()]
    remote = ["python3", "-I", "-"] if script is not None else ["true"]
    start = time.monotonic()
    procs = [subprocess.Popen([*args, "-p", str(h["ansible_port"]), "root@127.0.0.1", *remote],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE)
             for h in hosts.values()]
    for proc in procs:
        out, err = proc.communicate(script or b"")
        if proc.returncode != 0 or (script is not None and not out.startswith(b"{")):
            raise SystemExit(f"ssh failed: {err.decode()[-500:]}")
    return time.monotonic() - start


def time_ansible(inventory: Path, script_file: Path) -> float:
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"))
    start = time.monotonic()
    proc = subprocess.run(
        [str(BIN / "ansible"), "k8s_cluster", "-i", str(inventory), "-f", "5", "-m",
         "ansible.builtin.script", "-a", f"{script_file} executable=python3"],
        capture_output=True, text=True, env=env)
    elapsed = time.monotonic() - start
    if proc.returncode != 0:
        raise SystemExit(f"ansible exited {proc.returncode}: {proc.stdout[-2000:]}")
    return elapsed


def cluster_requests(extra_nodes: int) -> list[tuple[int, int, float]]:
    """(nodes, API requests, seconds) of the cluster phase's snapshot, with 4 then 4+N."""
    from kubernetes import client

    rows = []
    with running_emulator(default_lab_backend()) as emu, tempfile.TemporaryDirectory() as tmp:
        cfg = client.Configuration()
        cfg.host = emu.url
        core = client.CoreV1Api(client.ApiClient(cfg))
        kubeconfig = str(Path(tmp) / "kubeconfig")
        from gpuprov.lab.kube import app

        app.write_kubeconfig(Path(kubeconfig), emu.url)
        created = len(core.list_node().items)
        for total in (created, created + extra_nodes):
            for i in range(created, total):
                name = f"bulk-{i:04d}"
                core.create_node({"metadata": {"name": name, "labels": {
                    "kubernetes.io/hostname": name}}, "status": {"allocatable": {
                        "nvidia.com/gpu": "8"}}})
            created = total
            api = cluster.api_client(kubeconfig, None)
            before = emu.server.requests
            start = time.monotonic()
            view = cluster.snapshot(api)
            elapsed = time.monotonic() - start
            assert len(view.nodes) == total
            rows.append((total, emu.server.requests - before, elapsed))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-i", "--inventory", type=Path, help="an existing lab's hosts.yml")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--api-nodes", type=int, default=1000)
    args = parser.parse_args()
    own_lab = None
    if args.inventory is None:
        from gpuprov.lab.lab import Lab

        own_lab = Lab(Path(tempfile.mkdtemp(prefix="gpuprov-bench-")))
    try:
        if own_lab is not None:
            # Inside the try: a lab that fails to come up (a node's SSH too slow on a loaded
            # machine) is removed too, not left running.
            own_lab.up()
            args.inventory = own_lab.inventory_path
        common, hosts = lab_hosts(args.inventory)
        script = payload.probe_script()
        with tempfile.TemporaryDirectory(prefix="gpuprov-bench-") as tmp:
            script_file = Path(tmp) / "probe.py"
            script_file.write_bytes(script)
            results: dict[int, dict[str, float]] = {}
            tree_cpu: dict[int, dict[str, float]] = {}
            for count in (len(hosts), 64):
                inv = write_inventory(Path(tmp) / f"hosts-{count}.yml", common,
                                      hosts if count == len(hosts) else mapped(hosts, count))
                chosen = hosts if count == len(hosts) else mapped(hosts, count)
                runs: dict[str, list[tuple[float, float, float]]] = {
                    "verify": [], "ssh": [], "ansible": [], "connect": []}
                for _ in range(args.rounds):
                    runs["verify"].append(measured(time_verify, inv))
                    runs["ssh"].append(measured(time_ssh, common, chosen, script))
                    runs["ansible"].append(measured(time_ansible, inv, script_file))
                    runs["connect"].append(measured(time_ssh, common, chosen, None))
                results[count] = {k: statistics.median(w for w, _, _ in v)
                                  for k, v in runs.items()}
                cpu = {k: statistics.median(c for _, c, _ in v) for k, v in runs.items()}
                tree_cpu[count] = {k: statistics.median(t for _, _, t in v)
                                   for k, v in runs.items()}
                r = results[count]
                print(f"{count:3d} hosts: verify {r['verify']:.2f} s ({cpu['verify']:.1f} CPU-s), "
                      f"plain ssh {r['ssh']:.2f} s ({cpu['ssh']:.1f} CPU-s), "
                      f"ansible -m script (5 forks) {r['ansible']:.2f} s "
                      f"({cpu['ansible']:.1f} CPU-s), ssh `true` only {r['connect']:.2f} s "
                      f"({cpu['connect']:.1f} CPU-s)  (median of {args.rounds}, "
                      f"{os.cpu_count()} cores)")
        for total, requests, seconds in cluster_requests(args.api_nodes):
            print(f"cluster phase, {total:4d} API nodes: {requests} requests, {seconds:.3f} s")
        t = tree_cpu[64]
        print(f"controller CPU per host (64 hosts, process tree, median of {args.rounds}): "
              f"verify {1000 * t['verify'] / 64:.1f} ms, ansible -m script "
              f"{1000 * t['ansible'] / 64:.1f} ms, plain ssh {1000 * t['ssh'] / 64:.1f} ms")
        print(f"verify_cpu/ansible_cpu={t['verify'] / t['ansible']:.2f}")
        r = results[64]
        # Every way pays at least the connections; on a CPU-bound machine no method can be
        # faster than Ansible by more than ansible/connect.
        print(f"ceiling of any SSH-based method on this machine: ansible/connect="
              f"{r['ansible'] / r['connect']:.2f}")
        print(f"verify/ssh={r['verify'] / r['ssh']:.2f} "
              f"verify/ansible={r['verify'] / r['ansible']:.2f}")
    finally:
        if own_lab is not None:
            own_lab.down()
            # down() keeps what a lab directory reuses (its package repositories, 100 MB):
            # this one is not reused.
            shutil.rmtree(own_lab.project_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
