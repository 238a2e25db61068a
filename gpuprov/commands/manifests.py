"""`gpuprov manifests`: the Kubernetes objects the nvidia_device_plugin role applies.

Prints them as multi-document YAML, rendered from the repository's templates/ with the role's
defaults overlaid by `--values FILE` (the same variables, e.g. nvidia_device_plugin_version),
for review, GitOps, or `kubectl apply -f -` where Ansible does not reach the cluster.

Exit codes: 0 printed; 2 (USAGE) the values file is missing, malformed, has an unknown key or a
value of the wrong type, or the templates are not found.
"""

from __future__ import annotations

import argparse
import sys

from gpuprov import manifests
from gpuprov.errors import ExitCode


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "manifests",
        help="print the device plugin's Kubernetes manifests",
        description="Print, as multi-document YAML, exactly the objects the nvidia_device_plugin "
        "role applies (RuntimeClass, DaemonSet, and the ConfigMap with time-slicing), rendered "
        "from templates/ with roles/nvidia_device_plugin/defaults/main.yml. Exit 2: bad values.",
    )
    parser.add_argument("--values", metavar="FILE",
                        help="YAML mapping of nvidia_device_plugin_* variables overriding the "
                        "role defaults, e.g. 'nvidia_device_plugin_time_slicing_replicas: 4'")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    objects = manifests.device_plugin(args.values)
    sys.stdout.write(manifests.to_yaml(objects))
    return int(ExitCode.OK)
