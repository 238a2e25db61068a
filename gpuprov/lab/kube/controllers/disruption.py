"""The disruption controller (kubernetes pkg/controller/disruption): each PodDisruptionBudget's
status, from the pods its selector matches: currentHealthy (Ready pods), desiredHealthy
(minAvailable, or expected pods less maxUnavailable), expectedPods and disruptionsAllowed.
Evictions (Registry.evict) check the same counts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpuprov.lab.kube.registry import R

if TYPE_CHECKING:
    from gpuprov.lab.kube.cluster import Cluster


def sync_pdbs(cluster: Cluster) -> None:
    registry = cluster.registry
    for pdb in registry.list(R["PodDisruptionBudget"])[0]:
        healthy, expected = registry.pdb_counts(pdb)
        desired = registry.pdb_desired(pdb, expected)
        status = {**(pdb.get("status") or {}), "currentHealthy": healthy,
                  "desiredHealthy": desired, "expectedPods": expected,
                  "disruptionsAllowed": max(0, healthy - desired),
                  "observedGeneration": pdb["metadata"].get("generation", 1)}
        if status != pdb.get("status"):
            registry.replace(R["PodDisruptionBudget"], pdb["metadata"]["namespace"],
                             pdb["metadata"]["name"], {**pdb, "status": status}, "status")
