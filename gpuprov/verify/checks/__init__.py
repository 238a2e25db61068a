"""The checks, one module per family; importing this package registers the node phase's
families in gpuprov.verify.findings.CHECKS: reachability, NVML and the driver first (the
causes), then GPU health, host and runtime. The cluster and pod families (k8s, pods) need the
kubernetes client, which a node does not have: gpuprov.verify.runner registers them after
these, so report order stays the same. The node-phase families run on the nodes themselves
too, in the health agent's payload (gpuprov/verify/node_phase.py)."""

# isort: skip_file
from gpuprov.verify.checks import host, nvml, driver, gpu, runtime  # noqa: F401
