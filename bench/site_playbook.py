#!/usr/bin/env python3
"""Benchmark: `ansible-playbook site.yml` on a fresh 4-node lab, first and second run.

Prints, from one run:
  - the first run (bare nodes -> GPU nodes) and the second, idempotent run (goal: second at
    most 25% of the first). Each round brings up a fresh lab, runs site.yml once on the bare
    nodes and then IDEMPOTENT_RUNS times more (each of those is a second run: nothing left
    to change); the figures are the medians over the rounds' first runs and over all the
    idempotent runs, every run printed (a 2-core machine's timings vary by 10% run to run);
  - packages the driver role installed on each Debian GPU node (dpkg before/after), against
    what Debian's `nvidia-driver` metapackage would install on the same node before the run
    (`apt-get install -s`, counted in the same run; the goal is at most 75).

  - with --baseline REV: the second run of REV's site.yml too (a git worktree of REV, its own
    ansible.cfg, roles and gpuprov), on the same converged lab, alternating run for run with
    this checkout's, and the ratio this/baseline: how a change moved the idempotent run.

    .venv/bin/python bench/site_playbook.py [--rounds N] [--keep] [--baseline REV]

Downloaded packages come from the machine's cache (gpuprov/lab/cache.py), as in the tests,
so the first run measures installing, not the network.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
GPU_NODES = ("gpu-kepler", "gpu-pascal", "gpu-hopper")
IDEMPOTENT_RUNS = 3


def ssh(lab, node: str, command: str) -> str:
    return subprocess.run(lab.ssh_command(lab.require().node(node), command),
                          capture_output=True, text=True, check=True).stdout


def installed(lab, node: str) -> int:
    out = ssh(lab, node, "dpkg-query -W -f '${db:Status-Abbrev}\\n'")
    return sum(1 for line in out.splitlines() if line[1:2] == "i")


def metapackage_count(lab, node: str) -> int:
    """What `apt-get install nvidia-driver` would add here (non-free enabled for the question
    only, in a throw-away copy of the node's sources)."""
    script = (
        "set -e; d=$(mktemp -d); cp -r /etc/apt/sources.list* $d/; "
        "echo 'deb http://deb.debian.org/debian bookworm main contrib non-free "
        "non-free-firmware' > $d/extra.list; "
        "o=\"-o Dir::Etc::SourceList=$d/extra.list -o Dir::Etc::SourceParts=$d/sources.list.d "
        "-o Dir::State::Lists=$d/lists\"; mkdir -p $d/lists/partial; "
        "apt-get $o update -qq >/dev/null; apt-get $o install -s nvidia-driver | grep -c '^Inst '"
    )
    return int(ssh(lab, node, script).strip())


def site(lab, checkout: Path = REPO) -> tuple[float, dict[str, int]]:
    """One site.yml run from a checkout: seconds, and changed tasks per host."""
    env = dict(os.environ, ANSIBLE_CONFIG=str(checkout / "ansible.cfg"),
               PYTHONPATH=str(checkout))
    start = time.monotonic()
    proc = subprocess.run([str(BIN / "ansible-playbook"), "-i", str(lab.inventory_path),
                           "site.yml"], cwd=checkout, env=env, capture_output=True, text=True)
    elapsed = time.monotonic() - start
    if proc.returncode != 0:
        raise SystemExit(f"site.yml ({checkout}) failed ({proc.returncode}):\n"
                         f"{proc.stdout[-4000:]}")
    changed = {}
    for line in proc.stdout.split("PLAY RECAP", 1)[-1].splitlines():
        host, _, stats = line.partition(":")
        if "changed=" in stats:
            changed[host.strip()] = int(stats.split("changed=", 1)[1].split()[0])
    return elapsed, changed


def idempotent(lab, checkout: Path) -> float:
    """A second run: it must change nothing (else it measures work, not the read)."""
    elapsed, changed = site(lab, checkout)
    if any(changed.values()):
        raise SystemExit(f"site.yml from {checkout} changed {changed} on a converged lab")
    return elapsed


def baseline_checkout(rev: str) -> Path:
    path = Path(tempfile.mkdtemp(prefix="gpuprov-bench-baseline-")) / "checkout"
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "-q", str(path), rev],
                   check=True)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2, help="fresh labs (default 2)")
    parser.add_argument("--keep", action="store_true", help="leave the last lab up afterwards")
    parser.add_argument("--baseline", metavar="REV",
                        help="also time REV's second run (a git commit), alternating with this one")
    args = parser.parse_args()
    baseline = baseline_checkout(args.baseline) if args.baseline else None
    try:
        run_rounds(args, baseline)
    finally:
        if baseline is not None:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force",
                            str(baseline)], check=False)


def run_rounds(args: argparse.Namespace, baseline: Path | None) -> None:
    from gpuprov.lab.lab import Lab

    firsts: list[float] = []
    seconds: list[float] = []
    baseline_seconds: list[float] = []
    for round_ in range(1, max(1, args.rounds) + 1):
        lab = Lab(Path(tempfile.mkdtemp(prefix="gpuprov-bench-site-")))
        try:
            lab.up()
            before = {n: installed(lab, n) for n in GPU_NODES}
            metapackage = metapackage_count(lab, "gpu-pascal")
            firsts.append(site(lab)[0])
            runs, baseline_runs = [], []
            for _ in range(IDEMPOTENT_RUNS):
                runs.append(idempotent(lab, REPO))
                if baseline is not None:
                    baseline_runs.append(idempotent(lab, baseline))
            seconds += runs
            baseline_seconds += baseline_runs
            added = {n: installed(lab, n) - before[n] for n in GPU_NODES}
            print(f"round {round_}: first run {firsts[-1]:.1f} s, second (idempotent) runs "
                  + ", ".join(f"{t:.1f}" for t in runs) + " s")
            if baseline_runs:
                print(f"round {round_}: baseline {args.baseline} second runs "
                      + ", ".join(f"{t:.1f}" for t in baseline_runs) + " s")
        finally:
            if not (args.keep and round_ == args.rounds):
                lab.down()
    first, second = statistics.median(firsts), statistics.median(seconds)
    print(f"site.yml on the 4-node lab: first run {first:.1f} s (median of {len(firsts)}), "
          f"second run {second:.1f} s (median of {len(seconds)})")
    if baseline_seconds:
        base = statistics.median(baseline_seconds)
        print(f"second run: this checkout {second:.1f} s, baseline {args.baseline} {base:.1f} s "
              f"(medians of {len(seconds)}); this/baseline={second / base:.3f}")
    for node in GPU_NODES:
        print(f"{node}: the roles installed {added[node]} packages")
    print(f"Debian's nvidia-driver metapackage on a bare node: {metapackage} packages")
    print(f"second/first={second / first:.3f} (goal <= 0.25) "
          f"driver_packages/metapackage={max(added.values()) / metapackage:.2f} "
          f"max_driver_packages={max(added.values())} (goal <= 75)")


if __name__ == "__main__":
    main()
