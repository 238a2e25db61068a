"""The three PATCH flavours the API server accepts: JSON patch, JSON merge patch, strategic merge.

Hand-written: no JSON patch library is in the project's environment, and each algorithm is a
short RFC (6902, 7386). Strategic merge follows the merge keys and strategies that the
official schemas declare (schema.py), so lists such as containers, env, volumes, tolerations
or conditions behave as on a real API server. Supported directives: `$patch: replace|delete`
(maps and list items), `$retainKeys`, `$deleteFromPrimitiveList/<field>`; `$setElementOrder`
is accepted and ignored (order is not significant to anything the emulator serves).
"""

from __future__ import annotations

import copy
from typing import Any

from gpuprov.lab.kube import schema
from gpuprov.lab.kube.errors import ApiError

_DELETE = object()


# -- RFC 7386 --------------------------------------------------------------------------------

def merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


# -- RFC 6902 --------------------------------------------------------------------------------

def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise ApiError(422, "Invalid", f"invalid JSON pointer {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _index(container: list, token: str, allow_end: bool) -> int:
    if token == "-" and allow_end:
        return len(container)
    if not token.isdigit():
        raise ApiError(422, "Invalid", f"invalid array index {token!r}")
    idx = int(token)
    if idx > len(container) or (idx == len(container) and not allow_end):
        raise ApiError(422, "Invalid", f"array index {idx} out of range")
    return idx


def _walk(doc: Any, tokens: list[str]) -> Any:
    for token in tokens:
        if isinstance(doc, list):
            doc = doc[_index(doc, token, False)]
        elif isinstance(doc, dict) and token in doc:
            doc = doc[token]
        else:
            raise ApiError(422, "Invalid", f"path /{'/'.join(tokens)} does not exist")
    return doc


def _add(doc: Any, tokens: list[str], value: Any) -> Any:
    if not tokens:
        return value
    parent = _walk(doc, tokens[:-1])
    if isinstance(parent, list):
        parent.insert(_index(parent, tokens[-1], True), value)
    elif isinstance(parent, dict):
        parent[tokens[-1]] = value
    else:
        raise ApiError(422, "Invalid", f"cannot add at /{'/'.join(tokens)}")
    return doc


def _remove(doc: Any, tokens: list[str]) -> Any:
    if not tokens:
        raise ApiError(422, "Invalid", "cannot remove the whole document")
    parent = _walk(doc, tokens[:-1])
    if isinstance(parent, list):
        return parent.pop(_index(parent, tokens[-1], False))
    if isinstance(parent, dict) and tokens[-1] in parent:
        return parent.pop(tokens[-1])
    raise ApiError(422, "Invalid", f"path /{'/'.join(tokens)} does not exist")


def json_patch(doc: Any, operations: Any) -> Any:
    if not isinstance(operations, list):
        raise ApiError.bad_request("a JSON patch must be a list of operations")
    doc = copy.deepcopy(doc)
    for op in operations:
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise ApiError.bad_request(f"invalid JSON patch operation: {op!r}")
        kind, tokens = op["op"], _pointer(op["path"])
        if kind == "add":
            doc = _add(doc, tokens, copy.deepcopy(op.get("value")))
        elif kind == "remove":
            _remove(doc, tokens)
        elif kind == "replace":
            _walk(doc, tokens)  # must exist
            if tokens:
                _remove(doc, tokens)
            doc = _add(doc, tokens, copy.deepcopy(op.get("value")))
        elif kind in ("move", "copy"):
            source = _pointer(op.get("from", ""))
            value = _remove(doc, source) if kind == "move" else copy.deepcopy(_walk(doc, source))
            doc = _add(doc, tokens, value)
        elif kind == "test":
            if _walk(doc, tokens) != op.get("value"):
                raise ApiError(422, "Invalid", f"test operation failed at {op['path']}")
        else:
            raise ApiError.bad_request(f"unknown JSON patch operation {kind!r}")
    return doc


# -- strategic merge patch -------------------------------------------------------------------

def _strip(value: Any) -> Any:
    """A value entering the object: without directives or nulls."""
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items()
                if not k.startswith("$") and v is not None}
    if isinstance(value, list):
        return [_strip(v) for v in value if not (isinstance(v, dict) and "$patch" in v)]
    return value


def strategic_merge(original: Any, patch: Any, node: dict | None) -> Any:
    if not isinstance(patch, dict):
        return _strip(patch)
    directive = patch.get("$patch")
    if directive == "replace":
        return _strip(patch)
    if directive == "delete":
        return _DELETE
    if not isinstance(original, dict):
        return _strip(patch)
    result = dict(original)
    for key, value in patch.items():
        if key.startswith("$deleteFromPrimitiveList/"):
            name = key.split("/", 1)[1]
            result[name] = [v for v in result.get(name) or [] if v not in value]
            continue
        if key.startswith("$"):
            continue
        if value is None:
            result.pop(key, None)
            continue
        sub = schema.child(node, key)
        if isinstance(value, list):
            merge_key, strategy = schema.merge_key(sub)
            if "merge" in strategy.split(","):
                result[key] = _merge_list(result.get(key) or [], value, merge_key,
                                          schema.items(sub))
            else:
                result[key] = _strip(value)
        else:
            merged = strategic_merge(result.get(key), value, sub)
            if merged is _DELETE:
                result.pop(key, None)
            else:
                result[key] = merged
    if "$retainKeys" in patch:
        keep = set(patch["$retainKeys"] or [])
        result = {k: v for k, v in result.items() if k in keep}
    return result


def _merge_list(original: list, patch: list, merge_key: str | None,
                item_node: dict | None) -> list:
    if any(isinstance(i, dict) and i.get("$patch") == "replace" and len(i) == 1 for i in patch):
        return [_strip(i) for i in patch if not (isinstance(i, dict) and "$patch" in i)]
    if merge_key is None:  # a set of primitives
        out = list(original)
        out.extend(v for v in patch if v not in out)
        return out
    out = list(original)
    for item in patch:
        if not isinstance(item, dict):
            continue
        positions = [i for i, o in enumerate(out)
                     if isinstance(o, dict) and o.get(merge_key) == item.get(merge_key)]
        if item.get("$patch") == "delete":
            out = [o for i, o in enumerate(out) if i not in positions]
        elif positions:
            out[positions[0]] = strategic_merge(out[positions[0]], item, item_node)
        else:
            out.append(_strip(item))
    return out


def apply_patch(content_type: str, original: dict, body: Any) -> dict:
    base = content_type.split(";")[0].strip().lower()
    if base == "application/json-patch+json":
        result = json_patch(original, body)
    elif base == "application/merge-patch+json":
        result = merge_patch(original, body)
    elif base in ("application/strategic-merge-patch+json", "application/apply-patch+yaml"):
        # Server-side apply is emulated as a strategic merge of the applied configuration:
        # no field ownership, no conflicts (documented in EMULATION.md).
        node = schema.root_schema(original.get("apiVersion", ""), original.get("kind", ""))
        result = strategic_merge(original, body, node)
    else:
        raise ApiError(415, "UnsupportedMediaType",
                       f"the body of the request was in an unknown format - accepted media "
                       f"types include: application/json-patch+json, "
                       f"application/merge-patch+json, application/apply-patch+yaml, "
                       f"application/strategic-merge-patch+json (got {content_type!r})")
    if not isinstance(result, dict):
        raise ApiError(422, "Invalid", "the patch did not produce an object")
    return result
