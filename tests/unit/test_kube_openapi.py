"""The OpenAPI documents of the emulated API (/openapi/v2, /openapi/v3): built from the official
schemas kubernetes-validate ships for the emulated version, complete, and served as client-go
fetches them (v2 in gnostic's protobuf, v3 through its discovery document and hashes)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest
import yaml

from gpuprov.lab.kube import openapi, resources, schema
from gpuprov.lab.kube.protostubs import load

POD = "io.k8s.api.core.v1.Pod"


def get(emulator, path: str, accept: str = "application/json"):
    req = urllib.request.Request(emulator.url + path, headers={"Accept": accept})

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args, **kwargs):
            return None

    opener = urllib.request.build_opener(NoRedirect)
    try:
        with opener.open(req, timeout=10) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read()


def refs(node) -> set[str]:
    if isinstance(node, dict):
        found = {node["$ref"]} if isinstance(node.get("$ref"), str) else set()
        return found.union(*(refs(v) for v in node.values()))
    if isinstance(node, list):
        return set().union(*(refs(v) for v in node))
    return set()


def patch_operations(doc: dict, rt: resources.ResourceType) -> list[dict]:
    want = {"group": rt.group, "version": rt.version, "kind": rt.kind}
    return [op for item in doc["paths"].values()
            if (op := item.get("patch")) and op["x-kubernetes-group-version-kind"] == want]


@pytest.mark.parametrize("rt", resources.RESOURCES, ids=lambda rt: rt.kind)
def test_every_served_kind_has_a_patch_operation_with_field_validation(rt):
    # What kubectl's --validate=strict looks for before it lets the server check fields
    # (cli-runtime query_param_verifier.go / _v3.go): the kind's PATCH operation, by its GVK
    # extension, with a fieldValidation query parameter; in v2 and in its group-version's v3.
    v3 = openapi.v3_document(f"apis/{rt.group}/{rt.version}" if rt.group
                             else f"api/{rt.version}")
    for doc in (openapi.v2_document(), v3):
        operations = patch_operations(doc, rt)
        assert operations
        assert all(any(p["name"] == "fieldValidation" and p["in"] == "query"
                       for p in op["parameters"]) for op in operations)


def test_v3_patch_operations_accept_strategic_merge_patch():
    # kubectl apply builds its patch from the v3 schema only where this content type is listed
    # (kubectl pkg/cmd/apply/patcher.go gvkSupportsPatchOpenAPIV3).
    item = openapi.v3_document("api/v1")["paths"]["/api/v1/namespaces/{namespace}/pods/{name}"]
    assert "application/strategic-merge-patch+json" in item["patch"]["requestBody"]["content"]


@pytest.mark.parametrize("name", ["v2", *openapi.group_versions()])
def test_every_reference_resolves(name):
    doc = openapi.v2_document() if name == "v2" else openapi.v3_document(name)
    defined = doc["definitions"] if name == "v2" else doc["components"]["schemas"]
    prefix = "#/definitions/" if name == "v2" else "#/components/schemas/"
    found = refs(doc)
    assert found and all(r.startswith(prefix) and r[len(prefix):] in defined for r in found)


def test_schemas_are_the_official_ones_converted_back():
    source = schema.published_definitions()[POD]
    pod = openapi.v2_document()["definitions"][POD]
    assert set(pod["properties"]) == set(source["properties"])
    assert pod["x-kubernetes-group-version-kind"] == source["x-kubernetes-group-version-kind"]
    # The converter's nullability, enums and strictness are gone ...
    assert pod["type"] == "object"
    assert "enum" not in pod["properties"]["kind"] and "enum" not in pod["properties"]["apiVersion"]
    assert "additionalProperties" not in pod
    # ... the patch metadata kubectl and the server merge by is kept.
    containers = openapi.v2_document()["definitions"]["io.k8s.api.core.v1.PodSpec"][
        "properties"]["containers"]
    assert (containers["x-kubernetes-patch-merge-key"],
            containers["x-kubernetes-patch-strategy"]) == ("name", "merge")
    v3_pod = openapi.v3_document("api/v1")["components"]["schemas"][POD]
    assert v3_pod["properties"]["spec"]["allOf"] == [
        {"$ref": "#/components/schemas/io.k8s.api.core.v1.PodSpec"}]


def test_int_or_string_and_quantity_as_apimachinery_declares_them():
    v2 = openapi.v2_document()["definitions"]
    v3 = openapi.v3_document("api/v1")["components"]["schemas"]
    assert {k: v for k, v in v2[openapi.INT_OR_STRING].items() if k != "description"} == \
        {"type": "string", "format": "int-or-string"}
    assert {k: v for k, v in v3[openapi.INT_OR_STRING].items() if k != "description"} == \
        {"oneOf": [{"type": "integer"}, {"type": "string"}], "format": "int-or-string"}
    assert {k: v for k, v in v2[openapi.QUANTITY].items() if k != "description"} == \
        {"type": "string"}
    assert {k: v for k, v in v3[openapi.QUANTITY].items() if k != "description"} == \
        {"oneOf": [{"type": "string"}, {"type": "number"}]}


def test_v3_discovery_points_at_each_document_by_its_hash(emulator):
    status, _, body = get(emulator, "/openapi/v3")
    assert status == 200
    paths = json.loads(body)["paths"]
    assert sorted(paths) == sorted(openapi.group_versions())
    url = paths["apis/policy/v1"]["serverRelativeURL"]
    status, headers, body = get(emulator, url)
    assert status == 200 and headers["Cache-Control"] == "public, immutable"
    assert url.endswith("hash=" + headers["ETag"].strip('"'))
    assert "io.k8s.api.policy.v1.PodDisruptionBudget" in json.loads(body)["components"]["schemas"]
    # A client holding an old hash is sent to the current document (kube-openapi handler3).
    status, headers, _ = get(emulator, "/openapi/v3/apis/policy/v1?hash=0")
    assert status == 301 and headers["Location"] == url
    assert get(emulator, "/openapi/v3/apis/no.such/v1")[0] == 404


def test_v2_is_served_as_json_and_as_gnostics_protobuf(emulator):
    status, headers, body = get(emulator, "/openapi/v2")
    assert status == 200 and headers["Content-Type"] == "application/json"
    assert json.loads(body)["swagger"] == "2.0"
    status, headers, body = get(emulator, "/openapi/v2", openapi.V2_PROTOBUF_ACCEPT[0])
    assert status == 200 and headers["Content-Type"] == openapi.V2_PROTOBUF_TYPE
    pb = load(openapi.GNOSTIC_PROTO, "OpenAPIv2_pb2")[0]
    doc = pb.Document()
    doc.ParseFromString(body)
    assert doc.swagger == "2.0" and doc.info.version == resources.GIT_VERSION
    # What cli-runtime's v2 verifier reads: the PATCH operation's GVK extension as YAML, and
    # its fieldValidation query parameter.
    item = next(p.value for p in doc.paths.path
                if p.name == "/api/v1/namespaces/{namespace}/pods/{name}")
    gvk = next(e.value.yaml for e in item.patch.vendor_extension
               if e.name == "x-kubernetes-group-version-kind")
    assert yaml.safe_load(gvk) == {"group": "", "kind": "Pod", "version": "v1"}
    assert "fieldValidation" in [
        p.parameter.non_body_parameter.query_parameter_sub_schema.name
        for p in item.patch.parameters]
    pod = next(d.value for d in doc.definitions.additional_properties if d.name == POD)
    assert {p.name for p in pod.properties.additional_properties} == \
        set(schema.published_definitions()[POD]["properties"])
