"""Node phase: run the probe on every node in parallel and keep every node's outcome.

probe_node() is the one seam for remote execution: tests replace it (monkeypatch
gpuprov.verify.nodes.probe_node, or pass probe=) with a function that returns recorded
reports or raises ProbeUnreachable, and nothing else in verify talks to a node.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import os
import shlex
import time
from collections.abc import Callable
from typing import Any

from gpuprov import payload, ssh
from gpuprov.verify.inventory import Node

log = logging.getLogger(__name__)

ProbeFunc = Callable[[Node, float], dict]
Progress = Callable[[int, int, str], None]


@dataclasses.dataclass(frozen=True)
class ProbeResult:
    node: Node
    report: dict[str, Any] | None
    error: str | None = None  # why there is no report
    unreachable: bool = False  # no session at all (vs. the probe failing on the node)
    seconds: float = 0.0


def probe_node(node: Node, timeout: float) -> dict:
    """The probe report of one node: over SSH (fabric), or in-process for a local node."""
    if node.target is None:
        return payload.run_probe_local()
    connection = ssh.connect(node.target, timeout=timeout)
    try:
        return payload.run_probe(connection, timeout=timeout)
    finally:
        connection.close()


def file_exists(node: Node, path: str, timeout: float) -> bool:
    """Whether a file exists on the node (the DRA claim smoke's CDI spec), over the SSH path
    the probe takes, or here for a local node. The path is gpuprov's, quoted all the same."""
    if node.target is None:
        return os.path.exists(path)
    connection = ssh.connect(node.target, timeout=timeout)
    try:
        return connection.run(f"test -e {shlex.quote(path)}", warn=True, hide=True,
                              timeout=timeout).ok
    finally:
        connection.close()


def _one(probe: ProbeFunc, node: Node, timeout: float) -> ProbeResult:
    started = time.monotonic()
    try:
        report = probe(node, timeout)
    except payload.ProbeUnreachable as exc:
        return ProbeResult(node, None, exc.message, True, time.monotonic() - started)
    except payload.ProbeError as exc:
        return ProbeResult(node, None, exc.message, False, time.monotonic() - started)
    except Exception as exc:  # one broken host must not cost the others' results
        log.debug("probe of %s crashed", node.name, exc_info=True)
        return ProbeResult(node, None, f"{type(exc).__name__}: {exc}", False,
                           time.monotonic() - started)
    return ProbeResult(node, report, None, False, time.monotonic() - started)


def collect(
    nodes: list[Node],
    timeout: float,
    concurrency: int,
    probe: ProbeFunc | None = None,
    progress: Progress | None = None,
) -> list[ProbeResult]:
    """Every node's ProbeResult, in the order of `nodes`; never raises for a node."""
    # Looked up at call time so that tests can monkeypatch the module attribute.
    probe = probe or probe_node
    if probe is probe_node and not all(node.local for node in nodes):
        # Build the script here, once: probe_script()'s lru_cache does not lock, and every
        # thread starting at once would each build it (0.1 CPU-s apiece).
        payload.probe_script()
    results: dict[str, ProbeResult] = {}
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=max(1, min(concurrency,
                                                                        len(nodes) or 1)))
    try:
        futures = {pool.submit(_one, probe, node, timeout): node for node in nodes}
        for future in concurrent.futures.as_completed(futures):
            result = future.result()
            results[result.node.name] = result
            log.debug("%s: %s in %.2f s", result.node.name,
                      result.error or "probed", result.seconds)
            if progress:
                progress(len(results), len(nodes), result.node.name)
    except BaseException:
        # Ctrl-C: drop what has not started; sessions in flight end by their timeout.
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown(wait=True)
    return [results[node.name] for node in nodes]
