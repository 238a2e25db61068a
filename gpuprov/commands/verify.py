"""`gpuprov verify`: prove every GPU node works (see gpuprov/verify/)."""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

from gpuprov.errors import GpuprovError
from gpuprov.output import print_json


def _ids(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


def _positive(kind: type) -> object:
    def parse(text: str) -> object:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"{text!r} must be greater than 0")
        return value

    return parse


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "verify",
        help="check that every GPU node works, from NVML to Kubernetes",
        description="Run the probe on every node of the inventory's gpu_nodes and "
        "k8s_cluster groups and check NVML, the driver, GPU health, the container runtime "
        "and, with a kubeconfig, the Kubernetes view. Exit 0: all passed; 1: a check "
        "failed; 2: bad input; 3: a host was unreachable and nothing failed.",
    )
    parser.add_argument("-i", "--inventory", metavar="INVENTORY",
                        help="Ansible inventory (default: Ansible's configured one)")
    parser.add_argument("--limit", metavar="PATTERN", help="Ansible host pattern")
    parser.add_argument("--kubeconfig", metavar="FILE",
                        help="default: the inventory's k8s_kubeconfig, $KUBECONFIG, "
                        "~/.kube/config")
    parser.add_argument("--context", metavar="NAME", help="kubeconfig context")
    parser.add_argument("-e", "--extra-vars", metavar="VARS", action="append", default=[],
                        help="settings over the inventory's, for every host, as "
                        "ansible-playbook takes them: KEY=VALUE ..., a YAML/JSON mapping, or "
                        "@FILE (e.g. -e nvidia_device_plugin_mig_strategy=mixed)")
    parser.add_argument("--host-vars", metavar="JSON",
                        help="settings per host, {host: {var: value}} as JSON or @FILE "
                        "(what the gpu_verify role passes from Ansible's hostvars)")
    selection = parser.add_mutually_exclusive_group()
    # default None, not (): an empty --checks "$VAR" must not mean "every check".
    selection.add_argument("--checks", metavar="IDS", type=_ids, default=None,
                           help="comma-separated check ids or families (gpu, k8s) to run")
    selection.add_argument("--skip", metavar="IDS", type=_ids, default=None,
                           help="comma-separated check ids or families to leave out")
    parser.add_argument("--no-pods", action="store_true",
                        help="leave out the pod phase (smoke pods)")
    parser.add_argument("--image", metavar="IMAGE",
                        help="CUDA image for pods.cuda-compat")
    parser.add_argument("--timeout", metavar="SECONDS", type=_positive(float), default=60.0,
                        help="per-host timeout (default 60)")
    parser.add_argument("--concurrency", metavar="N", type=_positive(int), default=32,
                        help="nodes probed at once (default 32)")
    parser.add_argument("--json", action="store_true", help="one JSON document on stdout")
    parser.add_argument("--junit", metavar="FILE", help="also write JUnit XML to FILE")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="show skipped checks and each problem's details")
    # SUPPRESS: `gpuprov --debug verify` keeps working (the main parser's flag).
    parser.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help="show tracebacks and debug logs")
    parser.set_defaults(func=run)


def _vars_argument(flag: str, text: str) -> dict:
    """-e's forms, as ansible-playbook's: @FILE (YAML or JSON), a YAML/JSON mapping, or
    KEY=VALUE pairs split like a shell line (values stay strings)."""
    import shlex

    import yaml

    if text.startswith("@"):
        try:
            text = Path(text[1:]).read_text()
        except OSError as exc:
            raise GpuprovError(f"{flag} {text}: cannot read it: {exc.strerror}") from None
    elif not text.lstrip().startswith(("{", "[")):
        try:
            pairs = shlex.split(text)
        except ValueError as exc:
            raise GpuprovError(f"{flag} {text!r}: {exc}") from None
        if all("=" in pair for pair in pairs) and pairs:
            return dict(pair.split("=", 1) for pair in pairs)
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise GpuprovError(f"{flag}: not YAML or JSON ({str(exc).splitlines()[0]}); give "
                           f"KEY=VALUE, a mapping, or @FILE") from None
    if not isinstance(value, dict):
        raise GpuprovError(f"{flag} must be KEY=VALUE pairs, a mapping, or @FILE with one")
    return value


def _progress(done: int, total: int, name: str) -> None:
    end = "\n" if done == total else ""
    sys.stderr.write(f"\r\033[Kprobed {done}/{total}: {name}{end}")
    sys.stderr.flush()


def run(args: argparse.Namespace) -> int:
    import logging

    from gpuprov.verify import inventory, report, runner

    if getattr(args, "debug", False):
        logging.getLogger().setLevel(logging.DEBUG)
    for flag, ids in (("--checks", args.checks), ("--skip", args.skip)):
        if ids == ():
            raise GpuprovError(f"{flag} is empty; give check ids or families, "
                               "comma-separated (e.g. nvml,gpu.ecc)")
    extra: dict = {}
    for text in args.extra_vars:
        extra.update(_vars_argument("-e", text))
    host_vars = _vars_argument("--host-vars", args.host_vars) if args.host_vars else None
    nodes = inventory.load(resolve_inventory(args.inventory), args.limit, host_vars, extra)
    options = runner.Options(only=args.checks or (), skip=args.skip or (), timeout=args.timeout,
                             concurrency=args.concurrency, kubeconfig=args.kubeconfig,
                             context=args.context, pods=not args.no_pods, image=args.image)
    # SIGTERM (a CI job cancelled) unwinds like Ctrl-C: the smoke namespace is removed.
    signal.signal(signal.SIGTERM, _interrupt)
    progress = _progress if sys.stderr.isatty() and not args.json else None
    findings = runner.run(nodes, options, progress=progress)
    if args.junit:
        try:
            report.write_junit(findings, args.junit)
        except OSError as exc:
            raise GpuprovError(f"cannot write JUnit report {args.junit}: {exc.strerror}") from None
    if args.json:
        print_json(report.json_document(findings))
    else:
        print(report.table(findings, verbose=args.verbose, colour=sys.stdout.isatty()))
    return int(report.exit_code(findings))


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def resolve_inventory(given: str | None) -> str:
    """-i INVENTORY, else the inventory ansible.cfg names (as ansible-playbook would)."""
    return given or _ansible_default_inventory()


def _ansible_default_inventory() -> str:
    from ansible import constants

    sources = [s for s in constants.DEFAULT_HOST_LIST or [] if s]
    if not sources:
        raise GpuprovError("no inventory: pass -i INVENTORY")
    return sources[0]
