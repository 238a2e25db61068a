#!/usr/bin/env python3
"""Benchmark: the CPU the lab's emulated Kubernetes API spends while the lab is idle.

The emulator (gpuprov/lab/kube) runs its controllers and kubelets in passes; an idle lab
should cost it a small fraction of a core. It once burnt about a third of a core where the
dev extras were missing (grpc), looping on the same exception twice a second.

For each variant, on the same lab, one after the other: the lab's emulator is stopped, the
variant's is started against the lab (a fresh API: the lab's nodes, no workloads), left to
settle (with --pods N, after N sleeping pods were created: a lab in use), then its process's
CPU time (/proc/<pid>/stat utime + stime) is read over --seconds
(default 60), with the lines its log grew by meanwhile. Variants: this checkout's emulator,
and with --baseline REV the emulator of REV (a git worktree of REV, measured in the same
run: the ratio this/baseline); each also with grpc made unimportable (--no-grpc), as after
`pip install -e .` without the dev extras. At the end the lab gets this checkout's emulator
back (its state, e.g. site.yml's objects, is not restored: the emulator keeps it in memory).

    .venv/bin/python bench/lab_api_idle.py [-d LAB_PROJECT_DIR] [--baseline REV] [--no-grpc]
                                           [--pods N]

Without -d it brings up a lab of its own in a temporary directory and removes it after.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from gpuprov.lab.cache import CONTAINERD
from gpuprov.lab.kube import app
from gpuprov.lab.lab import Lab

REPO = Path(__file__).resolve().parent.parent
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
SETTLE_SECONDS = 15.0

# Loaded at start-up from PYTHONPATH: grpc and grpc_tools cannot be imported, as in a virtualenv
# made with `pip install -e .` (no dev extras).
NO_GRPC = '''import sys

class _NoGrpc:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("grpc", "grpc_tools"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, _NoGrpc())
'''


@dataclass
class Figure:
    variant: str
    cpu_seconds: float
    seconds: float
    log_lines: int

    @property
    def share(self) -> float:
        return self.cpu_seconds / self.seconds


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime (proc(5))


def serve(checkout: Path, lab: Lab, no_grpc: bool, shim: Path) -> subprocess.Popen:
    env = dict(os.environ)
    paths = [str(checkout)] + ([str(shim)] if no_grpc else [])
    env["PYTHONPATH"] = os.pathsep.join(paths + [env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    log = open(lab.kube_dir / app.LOG_FILE, "ab")  # noqa: SIM115 (closed with the process)
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuprov.lab.kube", "serve", "--state-dir", str(lab.kube_dir),
         "--lab-dir", str(lab.dir)], cwd=checkout, env=env, stdin=subprocess.DEVNULL,
        stdout=log, stderr=log, start_new_session=True)
    log.close()
    deadline = time.monotonic() + 60
    while app.url(lab.kube_dir) is None:
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"the emulator of {checkout} did not start; see "
                             f"{lab.kube_dir / app.LOG_FILE}")
        time.sleep(0.2)
    return proc


def start_pods(lab: Lab, count: int) -> None:
    """`count` pods that sleep, placed by the scheduler: what a lab in use holds (verify's smoke
    pods, a user's). Each is a real container in its node, which the kubelet follows."""
    from kubernetes import client

    api = client.ApiClient(client.Configuration(host=app.url(lab.kube_dir)))
    core = client.CoreV1Api(api)
    core.create_namespace({"metadata": {"name": "bench-idle"}})
    for i in range(count):
        core.create_namespaced_pod("bench-idle", {
            "metadata": {"name": f"sleeper-{i}"},
            "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
                     "containers": [{"name": "sleep", "image": lab.require().pod_image,
                                     "command": ["sleep", "3600"]}]}})
    api.close()


def measure(name: str, checkout: Path, lab: Lab, no_grpc: bool, seconds: float,
            shim: Path, pods: int) -> Figure:
    app.stop(lab.kube_dir)
    proc = serve(checkout, lab, no_grpc, shim)
    try:
        if pods:
            start_pods(lab, pods)
        time.sleep(SETTLE_SECONDS)
        log = lab.kube_dir / app.LOG_FILE
        lines = log.read_text(errors="replace").count("\n")
        before, start = cpu_seconds(proc.pid), time.monotonic()
        time.sleep(seconds)
        used, elapsed = cpu_seconds(proc.pid) - before, time.monotonic() - start
        grown = log.read_text(errors="replace").count("\n") - lines
    finally:
        app.stop(lab.kube_dir)
        proc.wait(timeout=30)
    figure = Figure(name + (" without grpc" if no_grpc else ""), used, elapsed, grown)
    print(f"{figure.variant:<32} {figure.cpu_seconds:7.2f} CPU-s in {figure.seconds:5.1f} s = "
          f"{figure.share * 100:5.1f} % of a core; log +{figure.log_lines} lines", flush=True)
    return figure


def baseline_checkout(rev: str) -> Path:
    path = Path(tempfile.mkdtemp(prefix="gpuprov-bench-baseline-")) / "checkout"
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(path), rev],
                   check=True, capture_output=True)
    # Older revisions look for the CRI api.proto in the checkout's .cache: give them the
    # machine's copy, so that the baseline does not fail on a file this run has.
    (path / ".cache").mkdir(exist_ok=True)
    (path / ".cache" / "containerd").symlink_to(CONTAINERD)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-d", "--dir", type=Path, help="project directory of a lab that is up")
    parser.add_argument("--baseline", metavar="REV", help="also measure REV's emulator")
    parser.add_argument("--no-grpc", action="store_true",
                        help="also measure each variant with grpc unimportable")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--pods", type=int, default=0, metavar="N",
                        help="start N sleeping pods first (a lab in use), default 0")
    args = parser.parse_args()
    own = None if args.dir else Path(tempfile.mkdtemp(prefix="gpuprov-bench-api-"))
    lab = Lab(args.dir or own)
    baseline = baseline_checkout(args.baseline) if args.baseline else None
    shim = Path(tempfile.mkdtemp(prefix="gpuprov-bench-nogrpc-"))
    (shim / "sitecustomize.py").write_text(NO_GRPC)
    try:
        if own is not None:
            lab.up()
        variants = [("this checkout", REPO)]
        if baseline is not None:
            variants.append((f"baseline {args.baseline}", baseline))
        figures = {}
        for no_grpc in (False, True) if args.no_grpc else (False,):
            for name, checkout in variants:
                figure = measure(name, checkout, lab, no_grpc, args.seconds, shim, args.pods)
                figures[(name, no_grpc)] = figure
        if baseline is not None:
            for no_grpc in (False, True) if args.no_grpc else (False,):
                this = figures[("this checkout", no_grpc)].share
                base = figures[(f"baseline {args.baseline}", no_grpc)].share
                what = "without grpc" if no_grpc else "idle"
                print(f"api_cpu_this/baseline ({what})={this / base:.2f}" if base else
                      f"baseline used no CPU ({what})")
    finally:
        app.start_background(lab.kube_dir, lab_dir=lab.dir)
        app.write_kubeconfig(lab.kubeconfig_path, app.url(lab.kube_dir))
        if own is not None:
            lab.down()
        if baseline is not None:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force",
                            str(baseline)], check=False)


if __name__ == "__main__":
    main()
