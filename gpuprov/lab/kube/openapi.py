"""The OpenAPI documents the emulated API server publishes: /openapi/v2 and /openapi/v3.

kubectl needs them. `create`/`apply`/`replace` with the default `--validate=strict` first ask
whether the server checks fields itself (the `fieldValidation` parameter of the kind's PATCH
operation in /openapi/v3, else in /openapi/v2: k8s.io/cli-runtime pkg/resource
query_param_verifier_v3.go, query_param_verifier.go); without a document they stop with "failed
to download openapi". `apply` builds its strategic merge patch from the kind's schema in
/openapi/v3 (k8s.io/kubectl pkg/cmd/apply/patcher.go buildStrategicMergePatchFromOpenAPIV3),
`explain` reads the schemas of either.

Built, not written: the schemas are the emulated version's official ones as the
`kubernetes-validate` package ships them (the API server's published OpenAPI converted to JSON
Schema; schema.published_definitions), converted back:
- `"type": [t, "null"]` (the converter's nullability) -> `t`;
- the `enum` the converter put on apiVersion and kind of every top-level kind -> dropped;
- `$ref` -> `#/definitions/...` (v2) or `#/components/schemas/...` (v3), where the API server
  wraps a $ref with siblings in `allOf` (api/openapi-spec/v3/*.json of kubernetes);
- IntOrString and Quantity, which the converter turned into `oneOf`, as apimachinery declares
  them to the OpenAPI generator (pkg/util/intstr/intstr.go, pkg/api/resource/quantity.go:
  OpenAPISchemaType/OpenAPISchemaFormat for v2, OpenAPIV3OneOfTypes for v3; kube-openapi
  pkg/generators/openapi.go writes both).
The paths come from the emulator's resource table (resources.py): one operation per verb it
serves, with the operation extensions the API server's installer writes (`x-kubernetes-action`,
`x-kubernetes-group-version-kind`) and the query parameters it accepts; each document holds
the definitions its paths reach.

v2 is served as JSON and as the protobuf message client-go asks for (gnostic's
openapi_v2.Document, client-go discovery OpenAPISchema), converted as kube-openapi's
handler.ToProtoBinary does through gnostic's openapi_v2.ParseDocument: vendor extensions and
enum values as YAML text (to_protobuf below).
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import re
from typing import Any

import yaml

from gpuprov.lab.cache import CONTAINERD
from gpuprov.lab.kube import protostubs, resources, schema
from gpuprov.lab.kube.resources import GIT_VERSION, ResourceType

GNOSTIC_PROTO = (CONTAINERD / "gnostic/usr/share/gocode/src/github.com/google"
                 "/gnostic-models/openapiv2/OpenAPIv2.proto")
# What client-go sends for v2 (k8s.io/client-go discovery/discovery_client.go openAPIV2mimePb)
# and the name kube-openapi's handler answers with (pkg/handler/handler.go).
V2_PROTOBUF_ACCEPT = ("application/com.github.proto-openapi.spec.v2@v1.0+protobuf",
                      "application/com.github.proto-openapi.spec.v2.v1.0+protobuf")
V2_PROTOBUF_TYPE = "application/com.github.proto-openapi.spec.v2.v1.0+protobuf"

INT_OR_STRING = "io.k8s.apimachinery.pkg.util.intstr.IntOrString"
QUANTITY = "io.k8s.apimachinery.pkg.api.resource.Quantity"
META = "io.k8s.apimachinery.pkg.apis.meta.v1"
PATCH_TYPES = ("application/apply-patch+yaml", "application/json-patch+json",
               "application/merge-patch+json", "application/strategic-merge-patch+json")
GVK = "x-kubernetes-group-version-kind"

# (description-less) query parameters per operation, as the API server accepts them.
_LIST_PARAMS = (("allowWatchBookmarks", "boolean"), ("continue", "string"),
                ("fieldSelector", "string"), ("labelSelector", "string"), ("limit", "integer"),
                ("resourceVersion", "string"), ("resourceVersionMatch", "string"),
                ("sendInitialEvents", "boolean"), ("timeoutSeconds", "integer"),
                ("watch", "boolean"))
_WRITE_PARAMS = (("dryRun", "string"), ("fieldManager", "string"),
                 ("fieldValidation", "string"))
_PATCH_PARAMS = (*_WRITE_PARAMS, ("force", "boolean"))
_DELETE_PARAMS = (("dryRun", "string"), ("gracePeriodSeconds", "integer"),
                  ("ignoreStoreReadErrorWithClusterBreakingPotential", "boolean"),
                  ("orphanDependents", "boolean"), ("propagationPolicy", "string"))
_LOG_PARAMS = (("container", "string"), ("follow", "boolean"),
               ("insecureSkipTLSVerifyBackend", "boolean"), ("limitBytes", "integer"),
               ("previous", "boolean"), ("sinceSeconds", "integer"), ("stream", "string"),
               ("tailLines", "integer"), ("timestamps", "boolean"))


# -- the schemas ---------------------------------------------------------------------------------

def _scalar_definition(name: str, source: dict, v3: bool) -> dict | None:
    """IntOrString and Quantity as apimachinery declares them to the OpenAPI generator."""
    described = {"description": source["description"]} if "description" in source else {}
    if name == INT_OR_STRING:
        if v3:
            return {**described, "oneOf": [{"type": "integer"}, {"type": "string"}],
                    "format": "int-or-string"}
        return {**described, "type": "string", "format": "int-or-string"}
    if name == QUANTITY:
        if v3:
            return {**described, "oneOf": [{"type": "string"}, {"type": "number"}]}
        return {**described, "type": "string"}
    return None


def _convert(node: Any, ref_prefix: str, v3: bool) -> Any:
    """One JSON Schema node -> the OpenAPI schema it came from."""
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "$ref":
            out[key] = ref_prefix + value.rsplit("/", 1)[-1]
        elif key == "type" and isinstance(value, list):
            types = [t for t in value if t != "null"]
            out[key] = types[0] if len(types) == 1 else types
        elif key == "properties":
            out[key] = {name: _convert(prop, ref_prefix, v3) for name, prop in value.items()}
        elif key in ("items", "additionalProperties", "not"):
            out[key] = _convert(value, ref_prefix, v3)
        elif key in ("allOf", "anyOf", "oneOf"):
            out[key] = [_convert(item, ref_prefix, v3) for item in value]
        else:
            out[key] = copy.deepcopy(value)
    if v3 and "$ref" in out and len(out) > 1:
        out = {"allOf": [{"$ref": out.pop("$ref")}], **out}
    return out


def _definition(name: str, v3: bool) -> dict:
    source = schema.published_definitions()[name]
    scalar = _scalar_definition(name, source, v3)
    if scalar is not None:
        return scalar
    prefix = "#/components/schemas/" if v3 else "#/definitions/"
    out = _convert(source, prefix, v3)
    if GVK in source:
        for field in ("apiVersion", "kind"):
            (out.get("properties") or {}).get(field, {}).pop("enum", None)
    return out


def _refs(node: Any) -> set[str]:
    found: set[str] = set()
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str):
                found.add(value.rsplit("/", 1)[-1])
            else:
                found |= _refs(value)
    elif isinstance(node, list):
        for item in node:
            found |= _refs(item)
    return found


def _closure(names: set[str], v3: bool) -> dict[str, dict]:
    """The definitions named and every definition they reach, converted."""
    out: dict[str, dict] = {}
    todo = sorted(names)
    while todo:
        name = todo.pop()
        if name in out:
            continue
        out[name] = _definition(name, v3)
        todo += sorted(_refs(out[name]) - set(out))
    return dict(sorted(out.items()))


@functools.cache
def definition_name(group: str, version: str, kind: str) -> str:
    """The definition of a kind, found by its x-kubernetes-group-version-kind."""
    for name, source in schema.published_definitions().items():
        for gvk in source.get(GVK) or []:
            if (gvk.get("group", ""), gvk.get("version"), gvk.get("kind")) == \
                    (group, version, kind):
                return name
    raise KeyError(f"no definition of {group}/{version} {kind}")


def field_description(definition: str, field: str) -> str:
    """A field's description in the official schema (what the Go types' SwaggerDoc() give)."""
    prop = (schema.published_definitions()[definition].get("properties") or {}).get(field) or {}
    return prop.get("description", "")


# -- the paths -----------------------------------------------------------------------------------

def _group_camel(group: str) -> str:
    """The group as the API server's operation IDs and tags spell it (core, apps, node,
    rbacAuthorization)."""
    words = re.split(r"[.\-]", group.removesuffix(".k8s.io")) if group else ["core"]
    return words[0] + "".join(w[:1].upper() + w[1:] for w in words[1:])


@functools.cache
def _operations(rt: ResourceType) -> list[dict]:
    """Every operation the emulator serves for a resource type: path, method, action, the GVK
    and the body and response kinds (definition names), query parameters."""
    base = f"/apis/{rt.group}/{rt.version}" if rt.group else f"/api/{rt.version}"
    own = (rt.group, rt.version, rt.kind)
    kind_def = definition_name(*own)
    list_def = definition_name(rt.group, rt.version, rt.kind + "List")
    coll = f"{base}/namespaces/{{namespace}}/{rt.plural}" if rt.namespaced else \
        f"{base}/{rt.plural}"
    item = coll + "/{name}"
    scope = "Namespaced" if rt.namespaced else ""
    ops = []

    def op(path: str, method: str, action: str, verb_id: str, gvk: tuple, response: str | None,
           body: str | None = None, params: tuple = (), patch: bool = False,
           suffix: str = "") -> None:
        ops.append({"path": path, "method": method, "action": action, "gvk": gvk,
                    "response": response, "body": body, "params": params, "patch": patch,
                    "operationId": f"{verb_id}{_group_camel(rt.group)[:1].upper()}"
                                   f"{_group_camel(rt.group)[1:]}{rt.version.capitalize()}"
                                   f"{scope}{rt.kind}{suffix}",
                    "tag": f"{_group_camel(rt.group)}_{rt.version}"})

    status, delete_options, patch_def = f"{META}.Status", f"{META}.DeleteOptions", f"{META}.Patch"
    if "list" in rt.verbs:
        op(coll, "get", "list", "list", own, list_def, params=_LIST_PARAMS)
        if rt.namespaced:
            ops.append({**ops[-1], "path": f"{base}/{rt.plural}",
                        "operationId": ops[-1]["operationId"].replace("Namespaced", "")
                        + "ForAllNamespaces"})
    if "create" in rt.verbs:
        op(coll, "post", "post", "create", own, kind_def, kind_def, _WRITE_PARAMS)
    if "deletecollection" in rt.verbs:
        op(coll, "delete", "deletecollection", "deleteCollection", own, status, delete_options,
           _DELETE_PARAMS + _LIST_PARAMS)
    if "get" in rt.verbs:
        op(item, "get", "get", "read", own, kind_def)
    if "update" in rt.verbs:
        op(item, "put", "put", "replace", own, kind_def, kind_def, _WRITE_PARAMS)
    if "patch" in rt.verbs:
        op(item, "patch", "patch", "patch", own, kind_def, patch_def, _PATCH_PARAMS, True)
    if "delete" in rt.verbs:
        op(item, "delete", "delete", "delete", own, status, delete_options, _DELETE_PARAMS)
    for sub in rt.subresources:
        path = f"{item}/{sub.name}"
        suffix = sub.name.capitalize()
        if sub.name == "status":
            op(path, "get", "get", "read", own, kind_def, suffix=suffix)
            op(path, "put", "put", "replace", own, kind_def, kind_def, _WRITE_PARAMS,
               suffix=suffix)
            op(path, "patch", "patch", "patch", own, kind_def, patch_def, _PATCH_PARAMS, True,
               suffix=suffix)
        elif sub.name == "log":
            op(path, "get", "get", "read", own, None, params=_LOG_PARAMS, suffix=suffix)
        else:  # eviction, binding: a create of the subresource's kind
            sub_gvk = (sub.group if sub.group is not None else rt.group,
                       sub.version or rt.version, sub.kind)
            sub_def = definition_name(*sub_gvk)
            op(path, "post", "post", "create", sub_gvk, sub_def, sub_def, _WRITE_PARAMS,
               suffix=suffix)
    return ops


def _gvk_ext(gvk: tuple) -> dict:
    return {"group": gvk[0], "kind": gvk[2], "version": gvk[1]}


def _path_params(path: str, v3: bool) -> list[dict]:
    params = []
    for name in re.findall(r"\{(\w+)\}", path):
        spec = {"name": name, "in": "path", "required": True, "uniqueItems": True,
                "type": "string"}
        params.append(_param_v3(spec) if v3 else spec)
    pretty = {"name": "pretty", "in": "query", "uniqueItems": True, "type": "string"}
    params.append(_param_v3(pretty) if v3 else pretty)
    return params


def _param_v3(v2: dict) -> dict:
    out = {k: v for k, v in v2.items() if k not in ("type", "uniqueItems")}
    out["schema"] = {"type": v2["type"], "uniqueItems": True}
    return out


def _query(params: tuple, v3: bool) -> list[dict]:
    out = []
    for name, type_ in params:
        spec = {"name": name, "in": "query", "uniqueItems": True, "type": type_}
        out.append(_param_v3(spec) if v3 else spec)
    return out


def _paths(rts: tuple[ResourceType, ...], v3: bool) -> dict[str, dict]:
    prefix = "#/components/schemas/" if v3 else "#/definitions/"
    paths: dict[str, dict] = {}
    for rt in rts:
        for o in _operations(rt):
            entry = paths.setdefault(o["path"], {"parameters": _path_params(o["path"], v3)})
            operation: dict[str, Any] = {
                "operationId": o["operationId"], "tags": [o["tag"]],
                "parameters": _query(o["params"], v3),
                "x-kubernetes-action": o["action"], GVK: _gvk_ext(o["gvk"])}
            # pods/log answers text
            schema_ref = {"$ref": prefix + o["response"]} if o["response"] else \
                {"type": "string"}
            code = "201" if o["method"] == "post" else "200"
            if v3:
                ctype = "application/json" if o["response"] else "text/plain"
                operation["responses"] = {code: {"description": "OK", "content": {
                    ctype: {"schema": schema_ref}}}}
                if o["body"]:
                    types = PATCH_TYPES if o["patch"] else ("*/*",)
                    operation["requestBody"] = {"required": True, "content": {
                        t: {"schema": {"$ref": prefix + o["body"]}} for t in types}}
            else:
                operation["responses"] = {code: {"description": "OK", "schema": schema_ref}}
                operation["produces"] = ["application/json", "application/yaml"] \
                    if o["response"] else ["text/plain"]
                operation["consumes"] = list(PATCH_TYPES) if o["patch"] else ["*/*"]
                if o["body"]:
                    operation["parameters"].insert(0, {
                        "name": "body", "in": "body", "required": o["method"] != "delete",
                        "schema": {"$ref": prefix + o["body"]}})
            entry[o["method"]] = operation
    return dict(sorted(paths.items()))


# -- the documents -------------------------------------------------------------------------------

def _info() -> dict:
    return {"title": "Kubernetes", "version": GIT_VERSION}


@functools.cache
def v2_document() -> dict:
    paths = _paths(resources.RESOURCES, v3=False)
    return {"swagger": "2.0", "info": _info(), "paths": paths,
            "definitions": _closure(_refs(paths), v3=False)}


def group_versions() -> list[str]:
    """The v3 document names: api/v1, apis/<group>/<version>."""
    names = []
    for rt in resources.RESOURCES:
        name = f"apis/{rt.group}/{rt.version}" if rt.group else f"api/{rt.version}"
        if name not in names:
            names.append(name)
    return names


@functools.cache
def v3_document(name: str) -> dict | None:
    """The v3 document of one group-version (`api/v1`, `apis/apps/v1`), None if not served."""
    rts = tuple(rt for rt in resources.RESOURCES
                if (f"apis/{rt.group}/{rt.version}" if rt.group else f"api/{rt.version}")
                == name)
    if not rts:
        return None
    paths = _paths(rts, v3=True)
    return {"openapi": "3.0.0", "info": _info(), "paths": paths,
            "components": {"schemas": _closure(_refs(paths), v3=True)}}


@functools.cache
def document_bytes(name: str) -> bytes | None:
    """A document as served: "v2" or a v3 name, compact JSON."""
    doc = v2_document() if name == "v2" else v3_document(name)
    return None if doc is None else json.dumps(doc, separators=(",", ":")).encode()


def etag(data: bytes) -> str:
    """kube-openapi's ETag and v3 `hash` (pkg/handler3/handler.go computeETag)."""
    return hashlib.sha512(data).hexdigest().upper()


def v3_discovery() -> dict:
    """/openapi/v3: where each group-version's document is, with the hash of its content
    (kube-openapi pkg/handler3 OpenAPIV3Discovery)."""
    return {"paths": {name: {"serverRelativeURL": f"/openapi/v3/{name}?hash="
                                                  f"{etag(document_bytes(name) or b'')}"}
                      for name in group_versions()}}


# -- v2 as gnostic's protobuf message -------------------------------------------------------------

def _pb():
    return protostubs.load(GNOSTIC_PROTO, "OpenAPIv2_pb2")[0]


def _any(pb, value: Any):
    # gnostic keeps extension values and enum values as their YAML text (compiler.Marshal).
    return pb.Any(yaml=yaml.safe_dump(value, default_flow_style=False, sort_keys=False))


def _extensions(pb, node: dict) -> list:
    return [pb.NamedAny(name=k, value=_any(pb, v)) for k, v in node.items()
            if k.startswith("x-")]


_SCHEMA_SCALARS = ("format", "title", "description", "pattern", "discriminator")
_SCHEMA_NUMBERS = ("multipleOf", "maximum", "minimum")
_SCHEMA_INTS = ("maxLength", "minLength", "maxItems", "minItems", "maxProperties",
                "minProperties")
_SCHEMA_BOOLS = ("exclusiveMaximum", "exclusiveMinimum", "uniqueItems", "readOnly")


def _snake(name: str) -> str:
    return re.sub(r"([A-Z])", lambda m: "_" + m.group(1).lower(), name)


def _schema_pb(pb, node: dict):
    out = pb.Schema()
    if "$ref" in node:
        out._ref = node["$ref"]
    for key in (*_SCHEMA_SCALARS, *_SCHEMA_NUMBERS, *_SCHEMA_INTS, *_SCHEMA_BOOLS):
        if key in node:
            setattr(out, _snake(key), node[key])
    if "type" in node:
        types = node["type"] if isinstance(node["type"], list) else [node["type"]]
        out.type.value.extend(types)
    if "required" in node:
        out.required.extend(node["required"])
    if "enum" in node:
        out.enum.extend(_any(pb, v) for v in node["enum"])
    if "default" in node:
        out.default.CopyFrom(_any(pb, node["default"]))
    if "items" in node:
        items = node["items"] if isinstance(node["items"], list) else [node["items"]]
        out.items.schema.extend(_schema_pb(pb, i) for i in items)
    if "allOf" in node:
        out.all_of.extend(_schema_pb(pb, i) for i in node["allOf"])
    if "properties" in node:
        out.properties.additional_properties.extend(
            pb.NamedSchema(name=k, value=_schema_pb(pb, v)) for k, v in node["properties"].items())
    extra = node.get("additionalProperties")
    if isinstance(extra, bool):
        out.additional_properties.boolean = extra
    elif isinstance(extra, dict):
        out.additional_properties.schema.CopyFrom(_schema_pb(pb, extra))
    out.vendor_extension.extend(_extensions(pb, node))
    return out


def _parameter_pb(pb, param: dict):
    if param["in"] == "body":
        return pb.ParametersItem(parameter=pb.Parameter(body_parameter=pb.BodyParameter(
            name=param["name"], required=param.get("required", False),
            schema=_schema_pb(pb, param["schema"]), **{"in": "body"})))
    fields = {"name": param["name"], "required": param.get("required", False),
              "type": param["type"], "unique_items": param.get("uniqueItems", False),
              "in": param["in"]}
    if param["in"] == "path":
        sub = pb.NonBodyParameter(path_parameter_sub_schema=pb.PathParameterSubSchema(**fields))
    else:
        sub = pb.NonBodyParameter(
            query_parameter_sub_schema=pb.QueryParameterSubSchema(**fields))
    return pb.ParametersItem(parameter=pb.Parameter(non_body_parameter=sub))


def _operation_pb(pb, op: dict):
    out = pb.Operation(tags=op["tags"], operation_id=op["operationId"],
                       produces=op.get("produces", []), consumes=op.get("consumes", []))
    out.parameters.extend(_parameter_pb(pb, p) for p in op["parameters"])
    for code, response in op["responses"].items():
        out.responses.response_code.append(pb.NamedResponseValue(
            name=code, value=pb.ResponseValue(response=pb.Response(
                description=response["description"],
                schema=pb.SchemaItem(schema=_schema_pb(pb, response["schema"]))))))
    out.vendor_extension.extend(_extensions(pb, op))
    return out


def to_protobuf(doc: dict) -> bytes:
    """A v2 document as gnostic's openapi_v2.Document, serialised."""
    pb = _pb()
    out = pb.Document(swagger=doc["swagger"], info=pb.Info(**doc["info"]))
    for path, item in doc["paths"].items():
        value = pb.PathItem()
        value.parameters.extend(_parameter_pb(pb, p) for p in item.get("parameters", []))
        for method in ("get", "put", "post", "delete", "patch"):
            if method in item:
                getattr(value, method).CopyFrom(_operation_pb(pb, item[method]))
        out.paths.path.append(pb.NamedPathItem(name=path, value=value))
    out.definitions.additional_properties.extend(
        pb.NamedSchema(name=k, value=_schema_pb(pb, v)) for k, v in doc["definitions"].items())
    return out.SerializeToString()


@functools.cache
def v2_protobuf() -> bytes:
    return to_protobuf(v2_document())
