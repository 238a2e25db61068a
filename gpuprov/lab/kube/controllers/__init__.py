"""The control plane's controllers, one module each, as kwok splits its controllers
(pkg/kwok/controllers/*_controller.go). Each is a function of the Cluster that makes one
level-triggered pass over the registry; Cluster.reconcile runs them in order on its one thread:

    nodes.sync_nodes              node status, NVIDIA device plugin registration
    daemonsets.sync_daemonsets    the DaemonSet controller
    jobs.sync_jobs                the Job controller
    scheduler.schedule            kube-scheduler
    (kubelet.sync_kubelets        a kubelet per node: gpuprov.lab.kube.kubelet)
    disruption.sync_pdbs          the disruption controller (PodDisruptionBudget status)
    garbage.collect_garbage       the garbage collector and the namespace controller

Every write goes through the registry, so it is defaulted and validated like a client's.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from gpuprov.lab.kube.errors import ApiError

log = logging.getLogger(__name__)


def guarded(step: Callable, *args: object) -> None:
    """Run one object's reconciliation; a failure is logged and retried on the next pass
    without holding up the other objects."""
    try:
        step(*args)
    except ApiError as err:
        log.debug("%s: %s", step.__name__, err.message)
    except Exception:
        log.exception("%s failed", step.__name__)
