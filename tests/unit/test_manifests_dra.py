"""gpuprov.manifests.dra_driver: NVIDIA's DRA driver objects as the pinned release's chart
(kubernetes-sigs/dra-driver-nvidia-gpu v0.4.1, deployments/helm/dra-driver-nvidia-gpu) gives
them for GPU allocation, valid against the official strict 1.34 schemas (the first with
resource.k8s.io/v1), identical to what Ansible renders, on the DRA nodes only, and never on the
same node as the device plugin."""

from __future__ import annotations

import json
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from ansible_render import objects_by_ansible

from gpuprov import manifests
from gpuprov.errors import GpuprovError
from gpuprov.lab.kube import selectors
from gpuprov.nvidia import labels

ROOT = Path(__file__).resolve().parents[2]
ROLE = ROOT / "roles" / "nvidia_dra_driver"
# The chart's DeviceClass selectors (templates/deviceclass-gpu.yaml, deviceclass-mig.yaml).
CHART_SELECTORS = {
    "gpu.nvidia.com": "device.driver == 'gpu.nvidia.com' && "
                      "device.attributes['gpu.nvidia.com'].type == 'gpu'",
    "mig.nvidia.com": "device.driver == 'gpu.nvidia.com' && "
                      "device.attributes['gpu.nvidia.com'].type == 'mig'",
}


def values_file(tmp_path: Path, values: dict) -> Path:
    path = tmp_path / "values.yml"
    path.write_text(yaml.safe_dump(values))
    return path


def objects_of(objects: list[dict], kind: str) -> list[dict]:
    return [o for o in objects if o["kind"] == kind]


def daemonset(objects: list[dict]) -> dict:
    (found,) = objects_of(objects, "DaemonSet")
    return found


def test_the_default_objects_are_the_charts_gpu_parts():
    objects = manifests.dra_driver()
    assert [o["kind"] for o in objects] == [
        "Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "DaemonSet",
        "DeviceClass", "DeviceClass", "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding"]
    pod = daemonset(objects)["spec"]["template"]["spec"]
    image = "registry.k8s.io/dra-driver-nvidia/dra-driver-nvidia-gpu:v0.4.1"
    (container,) = pod["containers"]
    (init,) = pod["initContainers"]
    assert container["name"] == "gpus" and container["image"] == image
    assert init["image"] == image
    assert init["command"] == ["bash", "/usr/bin/kubelet-plugin-prestart.sh"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "void"  # runc, not NVIDIA's runtime
    assert env["CDI_ROOT"] == "/var/run/cdi"
    assert env["NVIDIA_DRIVER_ROOT"] == "/"
    assert env["IMAGE_NAME"] == image
    assert "FEATURE_GATES" not in env  # every alpha gate off
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts["plugins"]["mountPropagation"] == "Bidirectional"
    assert mounts["cdi"]["mountPath"] == "/var/run/cdi"
    paths = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"]}
    assert paths["plugins-registry"] == "/var/lib/kubelet/plugins_registry"
    assert paths["plugins"] == "/var/lib/kubelet/plugins"
    assert paths["driver-root-parent"] == "/" and paths["driver-root"] == "/"
    assert pod["priorityClassName"] == "system-node-critical"
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod[
        "tolerations"]
    assert pod["serviceAccountName"] == objects_of(objects, "ServiceAccount")[0]["metadata"][
        "name"]
    # No ComputeDomain parts.
    assert "compute-domain" not in json.dumps(objects)


def test_the_device_classes_are_the_charts_without_an_extended_resource():
    classes = {o["metadata"]["name"]: o["spec"] for o in objects_of(manifests.dra_driver(),
                                                                    "DeviceClass")}
    assert {name: [s["cel"]["expression"] for s in spec["selectors"]]
            for name, spec in classes.items()} == {
        name: [expression] for name, expression in CHART_SELECTORS.items()}
    assert all("extendedResourceName" not in spec for spec in classes.values())
    assert {o["apiVersion"] for o in objects_of(manifests.dra_driver(), "DeviceClass")} == {
        "resource.k8s.io/v1"}


def test_the_plugins_rights_are_the_charts_for_gpus_and_no_more():
    objects = manifests.dra_driver()
    (role,) = objects_of(objects, "ClusterRole")
    rights = {(g, r, v) for rule in role["rules"] for g in rule["apiGroups"]
              for r in rule["resources"] for v in rule["verbs"]}
    assert rights == {
        *{("resource.k8s.io", "resourceclaims", v) for v in ("get", "list", "watch")},
        *{("resource.k8s.io", "resourceslices", v)
          for v in ("get", "list", "watch", "create", "update", "delete")},
        *{("", "nodes", v) for v in ("get", "list", "watch", "update")},
        *{("", "pods", v) for v in ("get", "list", "watch")},
    }
    (binding,) = objects_of(objects, "ClusterRoleBinding")
    (account,) = objects_of(objects, "ServiceAccount")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount",
                                    "name": account["metadata"]["name"],
                                    "namespace": account["metadata"]["namespace"]}]
    # The slice policy restricts that same account to its own node's ResourceSlices.
    (policy,) = objects_of(objects, "ValidatingAdmissionPolicy")
    (condition,) = policy["spec"]["matchConditions"]
    assert condition["expression"] == (
        'request.userInfo.username == "system:serviceaccount:nvidia-dra-driver-gpu:'
        f'{account["metadata"]["name"]}"')
    (policy_binding,) = objects_of(objects, "ValidatingAdmissionPolicyBinding")
    assert policy_binding["spec"]["policyName"] == policy["metadata"]["name"]


def _node(mode: str) -> dict:
    set_labels = {k: v for k, v in labels.allocation_labels(mode).items() if v is not None}
    return {"metadata": {"name": mode, "labels": {labels.PRESENT: "true", **set_labels}}}


def _runs_on(pod: dict, node: dict) -> bool:
    return selectors.node_selector_matches(pod, node) and selectors.node_affinity_matches(
        pod, node)


def test_each_node_runs_exactly_one_of_the_two_allocators():
    dra = daemonset(manifests.dra_driver())["spec"]["template"]["spec"]
    plugin = daemonset(manifests.device_plugin())["spec"]["template"]["spec"]
    assert dra["nodeSelector"] == {labels.DEPLOY_DRA_DRIVER: "true"}
    assert [(_runs_on(plugin, _node(m)), _runs_on(dra, _node(m)))
            for m in ("device-plugin", "dra")] == [(True, False), (False, True)]
    # A GPU node that no one labelled for DRA stays on the device plugin.
    bare = {"metadata": {"name": "new", "labels": {labels.PRESENT: "true"}}}
    assert (_runs_on(plugin, bare), _runs_on(dra, bare)) == (True, False)


def test_a_mirror_gates_and_an_operator_driver_root(tmp_path):
    objects = manifests.dra_driver(values_file(tmp_path, {
        "nvidia_dra_driver_image_repository": "mirror.example:5000/dra-driver-nvidia-gpu",
        "nvidia_dra_driver_feature_gates": {"TimeSlicingSettings": "true", "MPSSupport": "false"},
        "nvidia_dra_driver_driver_root": "/run/nvidia/driver/",
        "nvidia_dra_driver_slice_policy": False,
        "nvidia_dra_driver_namespace": "gpu-dra"}))
    pod = daemonset(objects)["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == "mirror.example:5000/dra-driver-nvidia-gpu:v0.4.1"
    assert pod["initContainers"][0]["image"] == container["image"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["FEATURE_GATES"] == "MPSSupport=false,TimeSlicingSettings=true"
    paths = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"]}
    # The chart's `dir (trimSuffix "/" root)`.
    assert paths["driver-root-parent"] == "/run/nvidia"
    assert pod["initContainers"][0]["volumeMounts"][0] == {
        "name": "driver-root-parent", "mountPath": "/driver-root-parent",
        "mountPropagation": "HostToContainer"}
    assert not objects_of(objects, "ValidatingAdmissionPolicy")
    assert {o["metadata"].get("namespace") for o in objects if o["kind"] in (
        "ServiceAccount", "DaemonSet")} == {"gpu-dra"}


def test_a_bad_values_file_is_one_line(tmp_path):
    with pytest.raises(GpuprovError, match="unknown key 'nvidia_dra_driver_verison' "
                                           r"\(did you mean nvidia_dra_driver_version\?\)"):
        manifests.dra_driver(values_file(tmp_path, {"nvidia_dra_driver_verison": "v0.5.0"}))
    with pytest.raises(GpuprovError, match="nvidia_dra_driver_feature_gates must map strings"):
        manifests.dra_driver(values_file(tmp_path, {
            "nvidia_dra_driver_feature_gates": {"MPSSupport": True}}))


def test_every_object_validates_against_the_strict_1_34_schema():
    objects = manifests.dra_driver()
    for obj in objects:
        assert kubernetes_validate.validate(obj, "1.34", strict=True) == "1.34"
    broken = objects_of(objects, "DeviceClass")[0]
    broken["spec"]["selectors"][0]["cel"]["expresion"] = "true"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, "1.34", strict=True)


def test_role_defaults_and_argument_specs_list_the_same_settings():
    defaults = manifests.role_defaults(role=manifests.DRA_ROLE)
    # The role's own settings; gpu_allocation, each node's mode, is the inventory's (no
    # default: unset is device-plugin, gpuprov/gpu_allocation.py).
    options = {name: spec for name, spec in manifests.role_options(role=manifests.DRA_ROLE).items()
               if name.startswith("nvidia_dra_driver_")}
    assert set(defaults) == set(options)
    assert all(options[name].get("default") == value for name, value in defaults.items())


def test_ansible_renders_the_same_objects(tmp_path):
    values = values_file(tmp_path, {"nvidia_dra_driver_feature_gates": {"DynamicMIG": "true"},
                                    "nvidia_dra_driver_driver_root": "/run/nvidia/driver"})
    template = ROOT / "templates" / manifests.DRA_DRIVER_TEMPLATE
    assert objects_by_ansible(tmp_path, template, ROLE / "defaults" / "main.yml", values) \
        == manifests.dra_driver(values)


@pytest.mark.parametrize("given", ["false", "no", False])
def test_the_slice_policy_turned_off_from_the_command_line_is_off(given):
    # `-e nvidia_dra_driver_slice_policy=false` arrives as the string "false": truthy in plain
    # Jinja, off in Ansible's `bool`, which the template and gpuprov manifests both apply.
    values = {**manifests.load_values(None, None, manifests.DRA_ROLE),
              "nvidia_dra_driver_slice_policy": given}
    kinds = [o["kind"] for o in manifests.render(manifests.DRA_DRIVER_TEMPLATE, values)]
    assert "DaemonSet" in kinds
    assert not [k for k in kinds if k.startswith("ValidatingAdmissionPolicy")], kinds
