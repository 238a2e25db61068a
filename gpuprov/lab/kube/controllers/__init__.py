"""The control plane's controllers, one module each, as kwok splits its controllers
(pkg/kwok/controllers/*_controller.go). Each is a function of the Cluster that makes one
level-triggered pass over the registry; Cluster.reconcile runs them in order on its one thread:

    nodes.sync_nodes              node status, NVIDIA device plugin registration
    daemonsets.sync_daemonsets    the DaemonSet controller
    jobs.sync_jobs                the Job controller
    resourceclaims.sync_claims    the ResourceClaim controller (DRA)
    scheduler.schedule            kube-scheduler
    (kubelet.sync_kubelets        a kubelet per node: gpuprov.lab.kube.kubelet)
    disruption.sync_pdbs          the disruption controller (PodDisruptionBudget status)
    garbage.collect_garbage       the garbage collector and the namespace controller

Every write goes through the registry, so it is defaulted and validated like a client's.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from gpuprov.lab.kube.errors import ApiError

log = logging.getLogger(__name__)


# A failure that repeats at every pass (twice a second) is logged with its traceback once,
# then once a minute: a lab that cannot do something says so without filling its log and
# spending its CPU on the saying.
REPEAT_LOG_SECONDS = 60.0
_last_logged: dict[tuple[str, str], float] = {}


def log_failure(what: str, exc: BaseException) -> None:
    key = (what, f"{type(exc).__name__}: {exc}")
    clock = time.monotonic()
    last = _last_logged.get(key)
    if last is None:
        log.error("%s failed", what, exc_info=exc)
    elif clock - last >= REPEAT_LOG_SECONDS:
        log.error("%s still fails: %s", what, key[1])
    else:
        return
    _last_logged[key] = clock


def guarded(step: Callable, *args: object) -> None:
    """Run one object's reconciliation; a failure is logged and retried on the next pass
    without holding up the other objects."""
    try:
        step(*args)
    except ApiError as err:
        log.debug("%s: %s", step.__name__, err.message)
    except Exception as exc:
        log_failure(step.__name__, exc)
