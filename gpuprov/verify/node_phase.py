"""verify's node phase on one node's probe report: what `gpuprov verify` runs for every node it
probed, and what the health agent runs on the node itself (gpuprov/node/health/agent.py) on a
schedule: the same check ids and the same code, shipped to the node in the agent's payload
(gpuprov/payload.py, entry "health-agent"). So this module, the checks it registers and what
they import need no more than a node has: the standard library, gpuprov.nvidia, gpuprov.node
and gpuprov.runtime_mode (tests/unit/test_package_layout.py checks the payload imports)."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from gpuprov.verify import checks as _registered  # noqa: F401 (registers the node phase)
from gpuprov.verify.facts import NodeFacts
from gpuprov.verify.findings import CHECKS, Check, Finding, errored, skipped

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class NodeSettings:
    """What the node-phase checks read of an inventory node (gpuprov.verify.inventory.Node's
    fields of the same names and defaults; tests/unit/test_health_agent.py keeps them in
    step): the health agent gets them from its config, which the gpu_health role writes
    from the inventory."""

    name: str
    gpu_expected: bool = False
    driver_branch_pin: str | None = None
    driver_source: str | None = None
    driver_allow_vulnerable: bool = False
    toolkit_mode: str | None = None
    container_runtime: str | None = None
    mig_config: str | None = None
    mig_configs: Any = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> NodeSettings:
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


def node_checks(skip: Sequence[str] = ()) -> list[Check]:
    """The node phase's checks in report order, less `skip`."""
    return [c for c in CHECKS.values() if c.phase == "node" and c.id not in skip]


def evaluate_one(check: Check, node: str, facts: Any) -> Finding:
    try:
        verdict = check.func(facts)
    except Exception as exc:  # a check's bug is reported on its line, not as a crash
        log.debug("check %s on %s crashed", check.id, node, exc_info=True)
        verdict = errored(f"check crashed: {type(exc).__name__}: {exc}")
    return check.finding(node, verdict)


def evaluate(facts: NodeFacts, checks: Sequence[Check]) -> list[Finding]:
    """Every check on one node's facts; on a node without NVIDIA GPUs on PCI the GPU checks
    are skipped."""
    name = facts.node.name
    gpu_node = bool(facts.pci)
    return [check.finding(name, skipped("no NVIDIA GPU on PCI"))
            if check.gpu_only and not gpu_node else evaluate_one(check, name, facts)
            for check in checks]


def evaluate_report(settings: NodeSettings, report: Mapping[str, Any],
                    skip: Sequence[str] = ()) -> list[Finding]:
    """The node phase on a report of this very node (the health agent's call)."""
    facts = NodeFacts(settings, report)  # type: ignore[arg-type]
    facts = dataclasses.replace(facts, fleet={settings.name: facts})
    return evaluate(facts, node_checks(skip))


def _agent_evaluate(settings: Mapping[str, Any], report: Mapping[str, Any],
                    skip: Sequence[str] = ()) -> list[dict]:
    return [{"check": f.check, "status": f.status, "message": f.message}
            for f in evaluate_report(NodeSettings.from_json(settings), report, skip)]


def main(argv: list[str] | None = None) -> int:
    """The health agent's payload entry: the agent, with this node phase as its checks."""
    from gpuprov.node.health import agent

    return agent.main(argv, _agent_evaluate)
