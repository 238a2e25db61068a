"""Formatters (table, JSON, JUnit XML) and the exit code; each reads only Findings."""

from __future__ import annotations

import collections
import itertools
import json
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from typing import Any

from gpuprov.errors import ExitCode
from gpuprov.output import render_table
from gpuprov.verify.findings import CHECKS, ERROR, FAIL, PASS, SKIP, STATUSES, WARN, Finding

SCHEMA_VERSION = 1

_COLOURS = {PASS: "32", WARN: "33", FAIL: "31", ERROR: "35", SKIP: "2"}


def exit_code(findings: Sequence[Finding]) -> ExitCode:
    """1 if any check failed; else 3 if any could not run (unreachable host); else 0."""
    statuses = {f.status for f in findings}
    if FAIL in statuses:
        return ExitCode.CHECK_FAILED
    if ERROR in statuses:
        return ExitCode.UNREACHABLE
    return ExitCode.OK


def summary(findings: Sequence[Finding]) -> dict[str, Any]:
    counts = collections.Counter(f.status for f in findings)
    return {
        "nodes": len({f.node for f in findings}),
        "checks": len(findings),
        "counts": {status: counts.get(status, 0) for status in STATUSES},
        "failed_nodes": sorted({f.node for f in findings if f.status == FAIL}),
        "error_nodes": sorted({f.node for f in findings if f.status == ERROR}),
        "exit_code": int(exit_code(findings)),
    }


def _result(finding: Finding) -> dict[str, Any]:
    check = CHECKS.get(finding.check)
    return {
        "node": finding.node,
        "check": finding.check,
        "status": finding.status,
        "severity": check.severity if check else None,
        "message": finding.message,
        "details": dict(finding.details),
        "remediation": finding.remediation,
    }


def json_document(findings: Sequence[Finding]) -> dict[str, Any]:
    return {"schema_version": SCHEMA_VERSION,
            "results": [_result(f) for f in findings],
            "summary": summary(findings)}


def _status(status: str, colour: bool) -> str:
    word = status.upper()
    return f"\033[{_COLOURS[status]}m{word}\033[0m" if colour else word


def table(findings: Sequence[Finding], verbose: bool = False, colour: bool = False) -> str:
    """Per node: a heading, then one line per check; what to do under each problem."""
    blocks = []
    for node, group in itertools.groupby(findings, key=lambda f: f.node):
        rows = list(group)
        counts = collections.Counter(f.status for f in rows)
        heading = f"{node}: " + ", ".join(f"{counts[s]} {s}" for s in STATUSES if counts[s])
        lines: list[list[str]] = []
        for f in rows:
            if f.status == SKIP and not verbose:
                continue
            lines.append([_status(f.status, colour), f.check, f.message])
            if f.remediation and f.status != PASS:
                lines.append(["", "", f"fix: {f.remediation}"])
            if verbose and f.details and f.status != PASS:
                lines.append(["", "", "details: " + json.dumps(dict(f.details), default=str)])
        text = render_table(["STATUS", "CHECK", "MESSAGE"], lines) if lines else "  (all skipped)"
        blocks.append(f"{heading}\n{text}")
    total = summary(findings)
    tail = ", ".join(f"{n} {s}" for s, n in total["counts"].items() if n)
    blocks.append(f"verify: {total['nodes']} node(s), {total['checks']} result(s): {tail}")
    return "\n\n".join(blocks)


def junit(findings: Sequence[Finding]) -> ET.ElementTree:
    """One testsuite per node, one testcase per node and check (warnings pass, with the
    warning on system-out, as CI systems have no warning state)."""
    total = summary(findings)
    root = ET.Element("testsuites", name="gpuprov verify", tests=str(total["checks"]),
                      failures=str(total["counts"][FAIL]), errors=str(total["counts"][ERROR]),
                      skipped=str(total["counts"][SKIP]))
    for node, group in itertools.groupby(findings, key=lambda f: f.node):
        rows = list(group)
        counts = collections.Counter(f.status for f in rows)
        suite = ET.SubElement(root, "testsuite", name=node, tests=str(len(rows)),
                              failures=str(counts[FAIL]), errors=str(counts[ERROR]),
                              skipped=str(counts[SKIP]))
        for f in rows:
            case = ET.SubElement(suite, "testcase", classname=node, name=f.check)
            body = f.message + (f"\nfix: {f.remediation}" if f.remediation else "")
            if f.details and f.status != PASS:
                body += "\ndetails: " + json.dumps(dict(f.details), default=str)
            if f.status in (FAIL, ERROR):
                tag = "failure" if f.status == FAIL else "error"
                ET.SubElement(case, tag, message=f.message, type=f.check).text = body
            elif f.status == SKIP:
                ET.SubElement(case, "skipped", message=f.message)
            elif f.status == WARN:
                ET.SubElement(case, "system-out").text = f"WARNING: {body}"
    ET.indent(root)
    return ET.ElementTree(root)


def write_junit(findings: Sequence[Finding], path: str) -> None:
    junit(findings).write(path, encoding="utf-8", xml_declaration=True)
