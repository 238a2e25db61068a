"""Validation against the official Kubernetes OpenAPI schemas, and their patch metadata.

The schemas come from the `kubernetes-validate` package (offline, strict variants: unknown
fields are errors). Its `validate()` re-reads and re-compiles the schema on every call; the
API server validates every write, so validators are compiled once per kind here, from the
same files. The same schemas carry `x-kubernetes-patch-merge-key` / `-patch-strategy`, which
drive strategic merge patch (see patch.py): one source of truth for both.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterator
from importlib import resources as importlib_resources

import jsonschema
import kubernetes_validate
from referencing import Registry, Resource

from gpuprov.lab.kube.resources import KUBE_VERSION

SCHEMA_DIR = f"v{KUBE_VERSION}.0-local-strict"
# The same schemas without the strict variant's additionalProperties:false, which the API
# server's published OpenAPI documents do not have (openapi.py rebuilds those from them).
PUBLISHED_SCHEMA_DIR = f"v{KUBE_VERSION}.0-local"


def _schema_file(name: str, directory: str = SCHEMA_DIR) -> dict:
    root = importlib_resources.files(kubernetes_validate)
    return json.loads(root.joinpath("kubernetes-json-schema", directory, name).read_text())


@functools.cache
def published_definitions() -> dict[str, dict]:
    """Every definition of the emulated version's OpenAPI, by name
    (io.k8s.api.core.v1.Pod, ...), as kubernetes-validate converted them to JSON Schema."""
    return _schema_file("_definitions.json", PUBLISHED_SCHEMA_DIR)["$defs"]


@functools.cache
def _definitions() -> dict:
    return _schema_file("_definitions.json")


@functools.cache
def _registry() -> Registry:
    return Resource.from_contents(_definitions()) @ Registry()


def _file_name(api_version: str, kind: str) -> str:
    group, _, version = api_version.rpartition("/")
    prefix = f"{group.split('.')[0]}-" if group else ""
    return f"{kind.lower()}-{prefix}{version}.json"


@functools.cache
def root_schema(api_version: str, kind: str) -> dict | None:
    try:
        return _schema_file(_file_name(api_version, kind))
    except FileNotFoundError:
        return None


@functools.cache
def _validator(api_version: str, kind: str) -> jsonschema.protocols.Validator | None:
    schema = root_schema(api_version, kind)
    if schema is None:
        return None
    cls = jsonschema.validators.Draft202012Validator
    return cls(schema, registry=_registry())


def field_path(path: Iterator) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def validate(obj: dict) -> list[tuple[str, str, str]]:
    """Schema errors as StatusCause triples (reason, field, message); [] when valid."""
    validator = _validator(obj.get("apiVersion", ""), obj.get("kind", ""))
    if validator is None:
        return [("FieldValueNotSupported", "kind",
                 f"no schema for {obj.get('apiVersion')} {obj.get('kind')}")]
    causes = []
    for err in sorted(validator.iter_errors(obj), key=lambda e: list(map(str, e.path)))[:10]:
        # Errors under anyOf/oneOf read better from their most specific branch.
        best = jsonschema.exceptions.best_match([err]) if err.context else err
        message = best.message
        reason = "FieldValueInvalid"
        if best.validator == "additionalProperties":
            reason = "FieldValueNotSupported"
            unexpected = re.findall(r"'([^']+)' (?:was|were) unexpected", message)
            if unexpected:
                message = f"unknown field {unexpected[0]!r}"
                causes.append((reason, field_path([*best.absolute_path, unexpected[0]]),
                               message))
                continue
        elif best.validator == "required":
            reason = "FieldValueRequired"
            message = f"Required value: {message}"
        else:
            message = f"Invalid value: {message}"
        causes.append((reason, field_path(best.absolute_path), message))
    return causes


# -- schema walking, for strategic merge patch ---------------------------------------------

def _resolve(node: dict | None) -> dict | None:
    while node is not None and "$ref" in node:
        ref = node["$ref"]
        name = ref.rsplit("/", 1)[-1]
        node = _definitions()["$defs"].get(name)
    return node


def child(node: dict | None, key: str) -> dict | None:
    node = _resolve(node)
    if node is None:
        return None
    props = node.get("properties") or {}
    if key in props:
        return _resolve(props[key])
    extra = node.get("additionalProperties")
    return _resolve(extra) if isinstance(extra, dict) else None


def items(node: dict | None) -> dict | None:
    node = _resolve(node)
    return _resolve(node.get("items")) if node else None


def merge_key(node: dict | None) -> tuple[str | None, str]:
    """(patch merge key, patch strategy) of a list-valued schema node."""
    if node is None:
        return None, ""
    return node.get("x-kubernetes-patch-merge-key"), node.get("x-kubernetes-patch-strategy", "")
