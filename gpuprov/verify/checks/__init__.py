"""The checks, one module per family; importing this package registers them all in
gpuprov.verify.findings.CHECKS. Import order is report order: reachability, NVML and the
driver first (the causes), then GPU health, host and runtime, then the cluster, then the
smoke pods."""

# isort: skip_file
from gpuprov.verify.checks import host, nvml, driver, gpu, runtime, k8s, pods  # noqa: F401
from gpuprov.verify.checks import containers, swarm  # noqa: F401
