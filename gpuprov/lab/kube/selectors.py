"""Label selectors, field selectors and node selector terms, as the API server evaluates them.

Hand-written: the kubernetes client ships no selector parser, and the grammar is small.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from gpuprov.lab.kube.errors import ApiError

Labels = Mapping[str, str]

_SET_RE = re.compile(r"^\s*(\S+)\s+(in|notin)\s*\((.*)\)\s*$")
_OP_RE = re.compile(r"^\s*([^!=\s]+)\s*(==|!=|=)\s*(\S*)\s*$")
_EXISTS_RE = re.compile(r"^\s*(!?)\s*([^!=\s()]+)\s*$")


@dataclass(frozen=True)
class Requirement:
    key: str
    op: str  # in, notin, exists, !exists (equality is `in` with one value)
    values: tuple[str, ...] = ()

    def matches(self, labels: Labels) -> bool:
        if self.op == "exists":
            return self.key in labels
        if self.op == "!exists":
            return self.key not in labels
        if self.op == "in":
            return self.key in labels and labels[self.key] in self.values
        if self.op == "notin":
            return self.key not in labels or labels[self.key] not in self.values
        if self.op in ("gt", "lt"):
            try:
                have, want = int(labels[self.key]), int(self.values[0])
            except (KeyError, ValueError):
                return False
            return have > want if self.op == "gt" else have < want
        raise AssertionError(self.op)


def _split_top_level(text: str) -> list[str]:
    parts, depth, cur = [], 0, []
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return [p for p in parts if p.strip()]


def parse_label_selector(text: str | None) -> list[Requirement]:
    if not text:
        return []
    reqs = []
    for part in _split_top_level(text):
        if m := _SET_RE.match(part):
            values = tuple(v.strip() for v in m.group(3).split(",") if v.strip())
            reqs.append(Requirement(m.group(1), m.group(2), values))
        elif m := _OP_RE.match(part):
            op = "notin" if m.group(2) == "!=" else "in"
            reqs.append(Requirement(m.group(1), op, (m.group(3),)))
        elif m := _EXISTS_RE.match(part):
            reqs.append(Requirement(m.group(2), "!exists" if m.group(1) else "exists"))
        else:
            raise ApiError.bad_request(f"unable to parse requirement: {part.strip()!r}")
    return reqs


def matches_all(reqs: list[Requirement], labels: Labels | None) -> bool:
    labels = labels or {}
    return all(r.matches(labels) for r in reqs)


def from_label_selector_object(sel: Mapping | None) -> list[Requirement] | None:
    """metav1.LabelSelector -> requirements; None means 'selects nothing' (a null selector)."""
    if sel is None:
        return None
    reqs = [Requirement(k, "in", (v,)) for k, v in (sel.get("matchLabels") or {}).items()]
    for expr in sel.get("matchExpressions") or []:
        reqs.append(_expression(expr))
    return reqs


_EXPR_OPS = {"In": "in", "NotIn": "notin", "Exists": "exists", "DoesNotExist": "!exists",
             "Gt": "gt", "Lt": "lt"}


def _expression(expr: Mapping) -> Requirement:
    return Requirement(expr["key"], _EXPR_OPS[expr["operator"]], tuple(expr.get("values") or ()))


def node_selector_term_matches(term: Mapping, node: Mapping) -> bool:
    """A NodeSelectorTerm: every matchExpression (labels) and matchField (metadata.name)."""
    labels = node.get("metadata", {}).get("labels") or {}
    exprs = term.get("matchExpressions") or []
    fields = term.get("matchFields") or []
    if not exprs and not fields:
        return False  # an empty term matches no objects, as in the scheduler
    if not all(_expression(e).matches(labels) for e in exprs):
        return False
    name = {"metadata.name": node["metadata"]["name"]}
    return all(_expression(f).matches(name) for f in fields)


def node_affinity_matches(pod_spec: Mapping, node: Mapping) -> bool:
    required = (((pod_spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution"))
    if not required:
        return True
    return any(node_selector_term_matches(t, node) for t in required.get("nodeSelectorTerms", []))


def node_selector_matches(pod_spec: Mapping, node: Mapping) -> bool:
    labels = node.get("metadata", {}).get("labels") or {}
    wanted = pod_spec.get("nodeSelector") or {}
    return all(labels.get(k) == v for k, v in wanted.items())


def tolerates(tolerations: list[Mapping] | None, taint: Mapping) -> bool:
    for tol in tolerations or []:
        if tol.get("effect") and tol["effect"] != taint.get("effect"):
            continue
        op = tol.get("operator", "Equal")
        key = tol.get("key", "")
        if op == "Exists":
            if key in ("", taint["key"]):
                return True
        elif key == taint["key"] and tol.get("value", "") == taint.get("value", ""):
            return True
    return False


def untolerated_taints(pod_spec: Mapping, node: Mapping,
                       effects: tuple[str, ...] = ("NoSchedule", "NoExecute")) -> list[Mapping]:
    taints = (node.get("spec") or {}).get("taints") or []
    return [t for t in taints
            if t.get("effect") in effects and not tolerates(pod_spec.get("tolerations"), t)]


# -- field selectors -------------------------------------------------------------------------

@dataclass(frozen=True)
class FieldRequirement:
    path: str
    value: str
    negate: bool

    def matches(self, obj: Mapping) -> bool:
        have = field_value(obj, self.path)
        return (have != self.value) if self.negate else (have == self.value)


def field_value(obj: Mapping, path: str) -> str:
    cur: object = obj
    for part in path.split("."):
        cur = cur.get(part) if isinstance(cur, Mapping) else None
    if cur is None:
        return ""
    if isinstance(cur, bool):
        return "true" if cur else "false"
    return str(cur)


def parse_field_selector(text: str | None, allowed: tuple[str, ...]) -> list[FieldRequirement]:
    if not text:
        return []
    reqs = []
    for part in text.split(","):
        if not part.strip():
            continue
        m = re.match(r"^\s*([^!=\s]+)\s*(==|!=|=)\s*(.*?)\s*$", part)
        if not m:
            raise ApiError.bad_request(f"invalid field selector: {part.strip()!r}")
        path = m.group(1)
        if path not in ("metadata.name", "metadata.namespace", *allowed):
            raise ApiError.bad_request(f'field label not supported: "{path}"')
        reqs.append(FieldRequirement(path, m.group(3), m.group(2) == "!="))
    return reqs


def object_filter(label_sel: str | None, field_sel: str | None,
                  allowed_fields: tuple[str, ...]) -> Callable[[Mapping], bool]:
    labels = parse_label_selector(label_sel)
    fields = parse_field_selector(field_sel, allowed_fields)

    def accept(obj: Mapping) -> bool:
        meta = obj.get("metadata") or {}
        return matches_all(labels, meta.get("labels")) and all(f.matches(obj) for f in fields)

    return accept
