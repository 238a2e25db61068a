"""Benchmark: the health agent's budget (issue 33) on the lab's gpu-hopper profile (8 H100s).

The agent runs as the gpu_health role runs it: its payload script under a bare `python3 -I`, as
a child process of this bench, so its CPU time and peak RSS come from getrusage(RUSAGE_CHILDREN)
and /proc/PID/stat. What a node has comes from the lab's simulations on this machine, without a
container: the simulated NVML library (gpuprov/lab/nvml/simnvml.c, LD_LIBRARY_PATH and
GPUPROV_SIM_DIR) with gpu-hopper's 8 GPUs, its PCI tree (a root directory whose sys/bus/pci/devices
is the simulated tree, everything else this machine's), and a kernel log that is a plain file
(the follower polls its end every 0.2 s; on /dev/kmsg its reads block).

Three parts, each with its own agent:
  budget   --seconds (default 600) with a check cycle every --interval (default 60, the role's):
           average CPU (% of one core) and peak RSS; beside it, in the same run, one check cycle
           alone (--once) as the baseline of what one cycle costs.
  storm    --storm-lines (default 100000) records of one XID on one GPU written over
           --storm-seconds (default 60): the agent's CPU while it lasts, how long after the last
           write it had handled them all, and that they are one fault with that count.
  latency  --samples (default 20) XID records of new faults, each written to the kernel log and
           timed until the emulated API server shows it on the node (the GPUFault condition
           and the agent's gpuprov.io/health-faults annotation, written right after it).
  memory   resident memory after --memory-seconds (default 10, a cycle every 2 s) on a node whose
           python3 is the controller's (the shipped bytecode) and on one whose python3 is not
           (magic number replaced): without the bytecode cache (the prelude taken out of the
           script, as before gpuprov/node/health/launch.py), then its first and second start.

    .venv/bin/python bench/health_agent.py [--part budget|storm|latency|all] [--seconds 600]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gpuprov import payload
from gpuprov.lab import profiles, simhw
from gpuprov.lab.kube.testing import running_emulator
from gpuprov.node.health.kube import Client

NODE = "gpu-hopper"
PYTHON = "/usr/bin/python3"  # the machine's, not the venv's: a node has python3 only


def setup(tmp: Path) -> tuple[Path, dict]:
    library = simhw.build_nvml_library(tmp / "nvml")
    node_dir = tmp / "node"
    node_dir.mkdir()
    simhw.write_node_state(node_dir, NODE, profiles.NODE_PROFILES[NODE])
    root = tmp / "root"
    (root / "sys" / "bus" / "pci").mkdir(parents=True)
    (root / "sys" / "bus" / "pci" / "devices").symlink_to(node_dir / "pci")
    for name in ("etc", "proc", "boot", "lib", "usr", "var", "dev", "run", "opt"):
        (root / name).symlink_to(f"/{name}")
    (root / "sys" / "module").symlink_to("/sys/module")
    script = tmp / "health-agent.py"
    script.write_bytes(payload.node_script("health-agent"))
    env = dict(os.environ, LD_LIBRARY_PATH=str(library.parent),
               GPUPROV_SIM_DIR=str(node_dir / simhw.SIM_DIR))
    return script, {"env": env, "root": str(root)}


def config(tmp: Path, part: str, root: str, interval: float, url: str | None) -> Path:
    state = tmp / part
    state.mkdir()
    kmsg = state / "kmsg"
    kmsg.write_text(simhw.KMSG_BOOT)
    path = state / "health.json"
    path.write_text(json.dumps({
        "node_name": NODE, "state_dir": str(state / "state"), "kmsg": str(kmsg),
        "root": root, "interval_s": interval, "textfile_dir": str(state),
        "kube": {"server": url} if url else None, "settings": {"gpu_expected": True}}))
    return path


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_child(script: Path, cfg: Path, env: dict, extra: tuple = ()) -> subprocess.Popen:
    return subprocess.Popen([PYTHON, "-I", str(script), "agent", "--config", str(cfg), *extra],
                            env=env, stderr=open(cfg.parent / "agent.log", "w"))


def stop(child: subprocess.Popen) -> None:
    child.send_signal(signal.SIGTERM)  # what systemd sends
    try:
        child.wait(timeout=30)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()
        print("  (the agent did not stop within 30 s of SIGTERM: killed)")


def memory_mib(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) of a running process: resident now, and its peak."""
    values = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            values[key] = int(rest.split()[0]) / 1024
    return values.get("VmRSS", 0.0), values.get("VmHWM", 0.0)


def usage_since(before: resource.struct_rusage) -> tuple[float, float]:
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, after.ru_maxrss / 1024


def budget(tmp: Path, script: Path, sim: dict, seconds: float, interval: float) -> None:
    cfg = config(tmp, "once", sim["root"], interval, None)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    w0 = time.monotonic()
    subprocess.run([PYTHON, "-I", str(script), "agent", "--config", str(cfg), "--once"],
                   env=sim["env"], check=True, stderr=subprocess.DEVNULL)
    cpu, rss = usage_since(before)
    print(f"baseline, one check cycle (--once, start-up included): CPU {cpu:.3f} s, wall "
          f"{time.monotonic() - w0:.2f} s, peak RSS {rss:.1f} MiB")
    conditions = json.loads((tmp / "once" / "state" / "conditions.json").read_text())
    print("  its conditions: " + ", ".join(f"{c['type']}={c['status']}"
                                           for c in conditions["conditions"]))
    cfg = config(tmp, "budget", sim["root"], interval, None)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    child = run_child(script, cfg, sim["env"])
    w0 = time.monotonic()
    time.sleep(seconds)
    wall = time.monotonic() - w0
    now_rss, peak_rss = memory_mib(child.pid)
    stop(child)
    cpu, _ = usage_since(before)
    print(f"budget: {wall:.0f} s with a cycle every {interval:g} s: CPU {cpu:.2f} s = "
          f"{100 * cpu / wall:.3f} % of one core (goal <= 0.5 %); resident {now_rss:.1f} MiB "
          f"at the end, peak {peak_rss:.1f} MiB (VmHWM; goal <= 40 MiB)")


def storm(tmp: Path, script: Path, sim: dict, lines: int, seconds: float) -> None:
    with running_emulator() as emu:
        cfg = config(tmp, "storm", sim["root"], 3600, emu.url)
        kmsg = tmp / "storm" / "kmsg"
        state = tmp / "storm" / "state" / "state.json"
        child = run_child(script, cfg, sim["env"])
        deadline = time.monotonic() + 60
        while not state.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(2)  # the first cycle
        c0 = cpu_s(child.pid)
        w0 = time.monotonic()
        line = ("3,{seq},{usec},-;NVRM: Xid (PCI:0000:18:00): 95, pid=4242, name=python3, "
                "Uncontained: LTC TAG (0x2, 0x1). RST: Yes, D-RST: No\n")
        batches = max(1, int(seconds * 10))
        per = lines // batches
        seq = 1
        with open(kmsg, "a") as f:
            for b in range(batches):
                count = per if b < batches - 1 else lines - per * (batches - 1)
                f.write("".join(line.format(seq=s, usec=s * 10) for s in range(seq, seq + count)))
                f.flush()
                seq += count
                time.sleep(max(0.0, w0 + (b + 1) / 10 - time.monotonic()))
        written = time.monotonic()
        handled = None
        while time.monotonic() - written < 120:
            try:
                doc = json.loads(state.read_text())
            except ValueError:
                continue
            if doc.get("kmsg_seq", -1) >= lines:
                handled = time.monotonic()
                break
            time.sleep(0.05)
        cpu = cpu_s(child.pid) - c0
        wall = (handled or time.monotonic()) - w0
        faults = doc.get("faults", {})
        stop(child)
        counts = {k: f["count"] for k, f in faults.items()}
        print(f"storm: {lines} XID 95 records in {written - w0:.1f} s "
              f"({lines / (written - w0) * 60:.0f} a minute): "
              + (f"all handled {handled - written:.2f} s after the last write"
                 if handled else "NOT all handled within 120 s")
              + f"; agent CPU {cpu:.2f} s = {100 * cpu / wall:.1f} % of one core while it "
              f"lasted; faults {counts}")


def latency(tmp: Path, script: Path, sim: dict, samples: int) -> None:
    gpus = [line.split("=", 1)[1].strip().lower() for line in
            (tmp / "node" / simhw.SIM_DIR / simhw.NVML_CONF).read_text().splitlines()
            if line.startswith("pci_bus_id")]
    pcis = [f"{g.split(':')[0][-4:]}:{g.split(':')[1]}:{g.split(':')[2].split('.')[0]}"
            for g in gpus]
    with running_emulator() as emu:
        cfg = config(tmp, "latency", sim["root"], 3600, emu.url)
        kmsg = tmp / "latency" / "kmsg"
        child = run_child(script, cfg, sim["env"])
        api = Client({"server": emu.url}, NODE)

        def message() -> str:
            for c in api.get_node()["status"].get("conditions") or []:
                if c["type"] == "gpuprov.io/GPUFault":
                    return c["message"]
            return ""

        def published(xid: int, pci: str) -> bool:
            # The condition names every fault, the ones beyond its 1024 characters by reason
            # and GPU index; the agent's annotation, written in the same publish, has them all.
            faults = (api.get_node()["metadata"].get("annotations") or {}).get(
                "gpuprov.io/health-faults") or "[]"
            return any(f["reason"] == f"XID{xid}" and f.get("gpu") == pci
                       for f in json.loads(faults))

        deadline = time.monotonic() + 60
        while "no problem" not in message() and time.monotonic() < deadline:
            time.sleep(0.1)
        results = []
        for i in range(samples):
            pci = pcis[i % len(pcis)]
            xid = (48, 79, 95, 63)[i // len(pcis) % 4]
            with open(kmsg, "a") as f:
                f.write(f"3,{i + 1},{i},-;NVRM: Xid (PCI:{pci}): {xid}, pid=1, name=x, "
                        "bench\n")
            t0 = time.monotonic()
            while not published(xid, pci):
                if time.monotonic() - t0 > 10:
                    print("  sample timed out; the agent's log ends:\n"
                          + (tmp / "latency" / "agent.log").read_text()[-800:])
                    break
                time.sleep(0.005)
            results.append(time.monotonic() - t0)
        stop(child)
    results.sort()
    print(f"latency, kernel-log record -> node condition (and its annotation, written after "
          f"it), {samples} samples: median "
          f"{statistics.median(results):.3f} s, p90 {results[int(len(results) * 0.9) - 1]:.3f} s,"
          f" max {results[-1]:.3f} s (goal: median <= 2 s; the plain-file follower's poll is "
          "0.2 s of it)")


def _foreign(script: bytes, cache: bool) -> bytes:
    """The script as a controller with another Python than the node's builds it; without the
    health agent's bytecode cache where cache is False."""
    import base64
    import marshal
    import zlib

    head, rest = script.split(b"\n", 1)
    packed = marshal.loads(zlib.decompress(base64.b64decode(head[len(b'PAYLOAD = b"'):-1])))
    packed["magic"] = b"\x00\x00\r\n"
    encoded = base64.b64encode(zlib.compress(marshal.dumps(packed, payload.MARSHAL_VERSION)))
    if not cache:
        prelude = payload.PRELUDES["health-agent"].encode()
        assert prelude in rest
        rest = rest.replace(prelude, b"")
    return b'PAYLOAD = b"' + encoded + b'"\n' + rest


def memory(tmp: Path, script: Path, sim: dict, seconds: float) -> None:
    variants = {"shipped": script.read_bytes(),
                "foreign-nocache": _foreign(script.read_bytes(), cache=False),
                "foreign-cache": _foreign(script.read_bytes(), cache=True)}
    for name, text in variants.items():
        path = tmp / f"{name}.py"
        path.write_bytes(text)
        cfg = config(tmp, f"memory-{name}", sim["root"], 2, None)
        for start in (1, 2):
            child = run_child(path, cfg, sim["env"])
            time.sleep(seconds)
            rss, hwm = memory_mib(child.pid)
            stop(child)
            cached = sorted(p.name[:20] for p in (cfg.parent / "state").glob("payload-*"))
            print(f"memory, {name}, start {start}: resident {rss:.1f} MiB, peak {hwm:.1f} MiB "
                  f"(VmHWM of the running image){'; cache ' + cached[0] + '...' if cached else ''}")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--part", choices=("budget", "storm", "latency", "memory", "all"),
                        default="all")
    parser.add_argument("--memory-seconds", type=float, default=10)
    parser.add_argument("--seconds", type=float, default=600)
    parser.add_argument("--interval", type=float, default=60)
    parser.add_argument("--storm-lines", type=int, default=100000)
    parser.add_argument("--storm-seconds", type=float, default=60)
    # one new fault per sample (8 GPUs x 4 XIDs: up to 32 different ones)
    parser.add_argument("--samples", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        script, sim = setup(tmp)
        print(f"agent payload script {script.stat().st_size} bytes; python3 "
              + subprocess.run([PYTHON, "-V"], capture_output=True, text=True).stdout.split()[1])
        if args.part in ("latency", "all"):
            latency(tmp, script, sim, args.samples)
        if args.part in ("storm", "all"):
            storm(tmp, script, sim, args.storm_lines, args.storm_seconds)
        if args.part in ("memory", "all"):
            memory(tmp, script, sim, args.memory_seconds)
        if args.part in ("budget", "all"):
            budget(tmp, script, sim, args.seconds, args.interval)
    return 0


if __name__ == "__main__":
    sys.exit(main())
