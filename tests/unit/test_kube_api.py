"""Conformance of the emulated Kubernetes API with the official client and DynamicClient."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request

import pytest
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic import DynamicClient
from kubernetes.dynamic.exceptions import ConflictError, NotFoundError, UnprocessibleEntityError

from gpuprov.lab.kube.resources import GIT_VERSION
from gpuprov.lab.kube.testing import wait_for


@pytest.fixture(scope="module")
def core(api):
    return client.CoreV1Api(api)


@pytest.fixture(scope="module")
def dyn(api):
    return DynamicClient(api)


@pytest.fixture
def ns(core, request):
    name = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower())[:40].strip("-")
    core.create_namespace({"metadata": {"name": name}})
    yield name
    core.delete_namespace(name)


def raw(emulator, method: str, path: str, body=None, ctype="application/json"):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(emulator.url + path, data=data, method=method,
                                 headers={"Content-Type": ctype})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def pod(name: str, labels=None, **spec) -> dict:
    return {"metadata": {"name": name, "labels": labels or {}},
            "spec": {"containers": [{"name": "main", "image": "busybox:1.36",
                                     "command": ["true"]}], "restartPolicy": "Never", **spec}}


# -- discovery ---------------------------------------------------------------------------------

def test_version_reports_the_emulated_release(api):
    assert client.VersionApi(api).get_code().git_version.startswith(GIT_VERSION)


def test_dynamic_client_discovers_every_kind_the_project_uses(dyn):
    for api_version, kind in [("v1", "Namespace"), ("v1", "Node"), ("v1", "Pod"),
                              ("v1", "ConfigMap"), ("v1", "Event"), ("apps/v1", "DaemonSet"),
                              ("batch/v1", "Job"), ("node.k8s.io/v1", "RuntimeClass"),
                              ("policy/v1", "PodDisruptionBudget")]:
        res = dyn.resources.get(api_version=api_version, kind=kind)
        assert res.kind == kind
    pods = dyn.resources.get(api_version="v1", kind="Pod")
    assert {"status", "log", "eviction"} <= set(pods.subresources)


def test_unknown_group_is_404(emulator):
    code, body = raw(emulator, "GET", "/apis/nope.example.com/v1")
    assert code == 404 and body["reason"] == "NotFound"


# -- CRUD and errors ----------------------------------------------------------------------------

def test_create_get_list_delete_configmap(core, ns):
    created = core.create_namespaced_config_map(ns, {"metadata": {"name": "c1"},
                                                     "data": {"k": "v"}})
    assert created.metadata.uid and created.metadata.resource_version
    assert created.metadata.creation_timestamp is not None
    assert core.read_namespaced_config_map("c1", ns).data == {"k": "v"}
    assert [c.metadata.name for c in core.list_namespaced_config_map(ns).items] == ["c1"]
    core.delete_namespaced_config_map("c1", ns)
    with pytest.raises(ApiException) as err:
        core.read_namespaced_config_map("c1", ns)
    assert err.value.status == 404
    assert json.loads(err.value.body)["details"]["name"] == "c1"


def test_create_twice_is_409_already_exists(core, ns):
    core.create_namespaced_config_map(ns, {"metadata": {"name": "dup"}})
    with pytest.raises(ApiException) as err:
        core.create_namespaced_config_map(ns, {"metadata": {"name": "dup"}})
    assert err.value.status == 409
    assert json.loads(err.value.body)["reason"] == "AlreadyExists"


def test_create_in_missing_namespace_is_404(core):
    with pytest.raises(ApiException) as err:
        core.create_namespaced_config_map("no-such-ns", {"metadata": {"name": "x"}})
    body = json.loads(err.value.body)
    assert err.value.status == 404 and body["details"]["kind"] == "namespaces"


def test_put_with_stale_resource_version_is_409_conflict(core, ns):
    cm = core.create_namespaced_config_map(ns, {"metadata": {"name": "c"}, "data": {"a": "1"}})
    stale = cm.metadata.resource_version
    cm.data = {"a": "2"}
    updated = core.replace_namespaced_config_map("c", ns, cm)
    assert updated.metadata.resource_version != stale
    cm.data = {"a": "3"}
    cm.metadata.resource_version = stale
    with pytest.raises(ApiException) as err:
        core.replace_namespaced_config_map("c", ns, cm)
    assert err.value.status == 409 and json.loads(err.value.body)["reason"] == "Conflict"


def test_schema_violation_is_422_with_the_field(dyn, ns):
    pods = dyn.resources.get(api_version="v1", kind="Pod")
    bad = pod("bad")
    bad["spec"]["containers"][0]["imagee"] = "typo"
    with pytest.raises(UnprocessibleEntityError) as err:
        pods.create(body=bad, namespace=ns)
    status = json.loads(err.value.body)
    assert status["reason"] == "Invalid"
    assert status["details"]["causes"][0]["field"] == "spec.containers[0].imagee"


def test_wrong_type_is_422(dyn, ns):
    cms = dyn.resources.get(api_version="v1", kind="ConfigMap")
    with pytest.raises(UnprocessibleEntityError):
        cms.create(body={"metadata": {"name": "x"}, "data": {"k": 5}}, namespace=ns)


def test_invalid_name_and_label_are_422(dyn, ns):
    cms = dyn.resources.get(api_version="v1", kind="ConfigMap")
    with pytest.raises(UnprocessibleEntityError):
        cms.create(body={"metadata": {"name": "Bad_Name"}}, namespace=ns)
    with pytest.raises(UnprocessibleEntityError):
        cms.create(body={"metadata": {"name": "ok", "labels": {"k": "no spaces"}}},
                   namespace=ns)


def test_gpu_request_must_equal_limit(dyn, ns):
    pods = dyn.resources.get(api_version="v1", kind="Pod")
    bad = pod("gpu")
    bad["spec"]["containers"][0]["resources"] = {"requests": {"nvidia.com/gpu": "1"}}
    with pytest.raises(UnprocessibleEntityError):
        pods.create(body=bad, namespace=ns)


def test_dynamic_client_conflict_and_not_found(dyn, ns):
    cms = dyn.resources.get(api_version="v1", kind="ConfigMap")
    cms.create(body={"metadata": {"name": "d"}}, namespace=ns)
    with pytest.raises(ConflictError):
        cms.create(body={"metadata": {"name": "d"}}, namespace=ns)
    with pytest.raises(NotFoundError):
        cms.get(name="missing", namespace=ns)


def test_dry_run_does_not_persist(core, ns):
    core.create_namespaced_config_map(ns, {"metadata": {"name": "dry"}}, dry_run="All")
    with pytest.raises(ApiException):
        core.read_namespaced_config_map("dry", ns)


def test_generation_bumps_on_spec_change_only(api, ns):
    batch = client.BatchV1Api(api)
    job = batch.create_namespaced_job(ns, {
        "metadata": {"name": "j"}, "spec": {"suspend": True, "template": pod("x")}})
    assert job.metadata.generation == 1
    job = batch.patch_namespaced_job("j", ns, {"metadata": {"labels": {"a": "b"}}})
    assert job.metadata.generation == 1
    job = batch.patch_namespaced_job("j", ns, {"spec": {"suspend": False}})
    assert job.metadata.generation == 2


# -- patch flavours ------------------------------------------------------------------------------

def test_strategic_merge_patch_merges_containers_by_name(core, ns):
    two = pod("p")
    two["spec"]["containers"].append({"name": "side", "image": "busybox:1.35",
                                      "command": ["true"]})
    core.create_namespaced_pod(ns, two)
    patched = core.patch_namespaced_pod("p", ns, {"spec": {"containers": [
        {"name": "side", "image": "busybox:1.37"}]}})
    images = {c.name: c.image for c in patched.spec.containers}
    assert images == {"main": "busybox:1.36", "side": "busybox:1.37"}


def test_merge_patch_removes_with_null_and_json_patch_edits(dyn, ns):
    cms = dyn.resources.get(api_version="v1", kind="ConfigMap")
    cms.create(body={"metadata": {"name": "m", "labels": {"a": "1", "b": "2"}}}, namespace=ns)
    out = cms.patch(name="m", namespace=ns, body={"metadata": {"labels": {"a": None}}},
                    content_type="application/merge-patch+json")
    assert dict(out.metadata.labels) == {"b": "2"}
    out = cms.patch(name="m", namespace=ns,
                    body=[{"op": "add", "path": "/metadata/labels/c", "value": "3"},
                          {"op": "remove", "path": "/metadata/labels/b"}],
                    content_type="application/json-patch+json")
    assert dict(out.metadata.labels) == {"c": "3"}


def test_node_cordon_patch(core):
    core.patch_node("cpu-only", {"spec": {"unschedulable": True}})
    try:
        assert core.read_node("cpu-only").spec.unschedulable is True
        taints = core.read_node("cpu-only").spec.taints
        assert not taints or all(t.key != "node.kubernetes.io/not-ready" for t in taints)
    finally:
        core.patch_node("cpu-only", {"spec": {"unschedulable": False}})


# -- selectors -----------------------------------------------------------------------------------

@pytest.mark.parametrize(("selector", "expected"), [
    ("tier=web", {"a", "b"}),
    ("tier==web", {"a", "b"}),
    ("tier!=web", {"c", "d"}),
    ("tier in (web,db)", {"a", "b", "c"}),
    ("tier notin (web)", {"c", "d"}),
    ("tier", {"a", "b", "c"}),
    ("!tier", {"d"}),
    ("tier=web,env=prod", {"a"}),
])
def test_label_selectors(core, selector, expected):
    ns = "selectors"
    if not any(n.metadata.name == ns for n in core.list_namespace().items):
        core.create_namespace({"metadata": {"name": ns}})
        for name, labels in {"a": {"tier": "web", "env": "prod"}, "b": {"tier": "web"},
                             "c": {"tier": "db"}, "d": {}}.items():
            core.create_namespaced_config_map(ns, {"metadata": {"name": name,
                                                                "labels": labels}})
    got = {c.metadata.name for c in
           core.list_namespaced_config_map(ns, label_selector=selector).items}
    assert got == expected


def test_field_selectors(core, ns):
    core.create_namespaced_pod(ns, pod("on-node", nodeName="cpu-only"))
    core.create_namespaced_pod(ns, pod("other", nodeName="gpu-kepler"))
    got = core.list_pod_for_all_namespaces(field_selector="spec.nodeName=cpu-only").items
    assert [p.metadata.name for p in got] == ["on-node"]
    got = core.list_namespaced_pod(ns, field_selector="metadata.name!=on-node").items
    assert [p.metadata.name for p in got] == ["other"]
    with pytest.raises(ApiException) as err:
        core.list_namespaced_pod(ns, field_selector="spec.bogus=1")
    assert err.value.status == 400


# -- watch ---------------------------------------------------------------------------------------

def test_watch_streams_changes_from_a_resource_version(core, ns):
    listed = core.list_namespaced_config_map(ns)
    core.create_namespaced_config_map(ns, {"metadata": {"name": "w1"}})
    core.patch_namespaced_config_map("w1", ns, {"data": {"x": "y"}})
    core.delete_namespaced_config_map("w1", ns)
    events = []
    for event in watch.Watch().stream(core.list_namespaced_config_map, ns,
                                      resource_version=listed.metadata.resource_version,
                                      timeout_seconds=1):
        events.append((event["type"], event["object"].metadata.name))
    assert events == [("ADDED", "w1"), ("MODIFIED", "w1"), ("DELETED", "w1")]


def test_watch_without_resource_version_starts_with_current_objects(core, ns):
    core.create_namespaced_config_map(ns, {"metadata": {"name": "there", "labels": {"w": "1"}}})
    core.create_namespaced_config_map(ns, {"metadata": {"name": "filtered"}})
    seen = [(e["type"], e["object"].metadata.name) for e in watch.Watch().stream(
        core.list_namespaced_config_map, ns, label_selector="w=1", timeout_seconds=1)]
    assert seen == [("ADDED", "there")]


def test_watch_reports_objects_leaving_the_selection_as_deleted(core, ns):
    start = core.list_namespaced_config_map(ns).metadata.resource_version
    core.create_namespaced_config_map(ns, {"metadata": {"name": "m", "labels": {"w": "1"}}})
    core.patch_namespaced_config_map("m", ns, {"metadata": {"labels": {"w": "2"}}})
    seen = [e["type"] for e in watch.Watch().stream(
        core.list_namespaced_config_map, ns, label_selector="w=1", resource_version=start,
        timeout_seconds=1)]
    assert seen == ["ADDED", "DELETED"]


# -- deletion ------------------------------------------------------------------------------------

def test_delete_collection_by_label(core, ns):
    for name, tier in (("a", "x"), ("b", "x"), ("c", "y")):
        core.create_namespaced_config_map(ns, {"metadata": {"name": name,
                                                            "labels": {"t": tier}}})
    core.delete_collection_namespaced_config_map(ns, label_selector="t=x")
    assert [c.metadata.name for c in core.list_namespaced_config_map(ns).items] == ["c"]


def test_deleting_a_namespace_waits_for_finalizers_then_removes_it(emulator, core):
    core.create_namespace({"metadata": {"name": "doomed"}})
    core.create_namespaced_config_map("doomed", {"metadata": {
        "name": "held", "finalizers": ["example.com/hold"]}})
    code, body = raw(emulator, "DELETE", "/api/v1/namespaces/doomed")
    assert code == 200 and body["status"]["phase"] == "Terminating"
    with pytest.raises(ApiException) as err:
        core.create_namespaced_config_map("doomed", {"metadata": {"name": "late"}})
    assert err.value.status == 403
    wait_for(lambda: core.read_namespaced_config_map("held", "doomed")
             .metadata.deletion_timestamp, "the held configmap to be marked for deletion")
    assert core.read_namespace("doomed").status.phase == "Terminating"
    core.patch_namespaced_config_map("held", "doomed", {"metadata": {"finalizers": None}})

    def gone():
        try:
            core.read_namespace("doomed")
        except ApiException as exc:
            return exc.status == 404
        return False

    wait_for(gone, "namespace doomed to be removed")


def test_runtime_class_crud_and_pod_admission(api, core, ns):
    node_api = client.NodeV1Api(api)
    node_api.create_runtime_class({"metadata": {"name": "nvidia-test"}, "handler": "nvidia"})
    assert node_api.read_runtime_class("nvidia-test").handler == "nvidia"
    with pytest.raises(ApiException) as err:
        core.create_namespaced_pod(ns, pod("rc", runtimeClassName="missing"))
    assert err.value.status == 403
    node_api.delete_runtime_class("nvidia-test")


def test_unknown_priority_class_is_refused(core, ns):
    with pytest.raises(ApiException) as err:
        core.create_namespaced_pod(ns, pod("pc", priorityClassName="nope"))
    assert err.value.status == 403
    created = core.create_namespaced_pod(ns, pod("pc", priorityClassName="system-node-critical"))
    assert created.spec.priority == 2000001000
