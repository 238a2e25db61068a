"""The resource types the emulated API serves, and the discovery documents built from them.

This table is the one place that says what the emulator serves: routing, discovery,
validation and the controllers all read it.
"""

from __future__ import annotations

from dataclasses import dataclass

# The Kubernetes version emulated: discovery, /version and schema validation all use it.
KUBE_VERSION = "1.36"
GIT_VERSION = "v1.36.0"

ALL_VERBS = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")
NAMESPACE_VERBS = ("create", "delete", "get", "list", "patch", "update", "watch")


@dataclass(frozen=True)
class Subresource:
    name: str
    verbs: tuple[str, ...]
    kind: str = ""  # empty: the parent's kind
    group: str | None = None  # set when the subresource's kind lives in another group
    version: str | None = None


STATUS = Subresource("status", ("get", "patch", "update"))


@dataclass(frozen=True)
class ResourceType:
    group: str  # "" for the core group
    version: str
    plural: str
    kind: str
    namespaced: bool
    short_names: tuple[str, ...] = ()
    subresources: tuple[Subresource, ...] = ()
    verbs: tuple[str, ...] = ALL_VERBS
    # Fields a fieldSelector may name beyond metadata.name / metadata.namespace, as the
    # real API server registers them per kind.
    selectable_fields: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def key(self) -> str:
        return f"{self.group}/{self.version}/{self.plural}"

    @property
    def singular(self) -> str:
        return self.kind.lower()

    def subresource(self, name: str) -> Subresource | None:
        return next((s for s in self.subresources if s.name == name), None)


RESOURCES: tuple[ResourceType, ...] = (
    ResourceType("", "v1", "namespaces", "Namespace", False, ("ns",), (STATUS,),
                 NAMESPACE_VERBS, ("status.phase",)),
    ResourceType("", "v1", "nodes", "Node", False, ("no",), (STATUS,),
                 selectable_fields=("spec.unschedulable",)),
    ResourceType(
        "", "v1", "pods", "Pod", True, ("po",),
        (
            STATUS,
            Subresource("log", ("get",)),
            Subresource("eviction", ("create",), "Eviction", "policy", "v1"),
            Subresource("binding", ("create",), "Binding"),
        ),
        selectable_fields=("spec.nodeName", "spec.restartPolicy", "spec.schedulerName",
                           "spec.serviceAccountName", "status.phase", "status.podIP",
                           "status.nominatedNodeName"),
        categories=("all",),
    ),
    ResourceType("", "v1", "configmaps", "ConfigMap", True, ("cm",)),
    ResourceType("", "v1", "secrets", "Secret", True, (), selectable_fields=("type",)),
    ResourceType("", "v1", "serviceaccounts", "ServiceAccount", True, ("sa",)),
    ResourceType("", "v1", "events", "Event", True, ("ev",),
                 selectable_fields=("involvedObject.kind", "involvedObject.namespace",
                                    "involvedObject.name", "involvedObject.uid",
                                    "involvedObject.apiVersion", "involvedObject.fieldPath",
                                    "reason", "reportingComponent", "source", "type")),
    ResourceType("apps", "v1", "daemonsets", "DaemonSet", True, ("ds",), (STATUS,),
                 categories=("all",)),
    ResourceType("batch", "v1", "jobs", "Job", True, (), (STATUS,),
                 selectable_fields=("status.successful",), categories=("all",)),
    ResourceType("node.k8s.io", "v1", "runtimeclasses", "RuntimeClass", False),
    ResourceType("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", True,
                 ("pdb",), (STATUS,)),
    ResourceType("scheduling.k8s.io", "v1", "priorityclasses", "PriorityClass", False, ("pc",)),
    ResourceType("coordination.k8s.io", "v1", "leases", "Lease", True),
    # Dynamic Resource Allocation (GA in 1.34): served with the validation their schemas lack
    # (validation.py); the claim controller, the scheduler's allocation and the kubelet's
    # prepare with a simulated NVIDIA plugin are emulated too (EMULATION.md).
    ResourceType("resource.k8s.io", "v1", "deviceclasses", "DeviceClass", False),
    ResourceType("resource.k8s.io", "v1", "resourceslices", "ResourceSlice", False,
                 selectable_fields=("spec.nodeName", "spec.driver")),
    ResourceType("resource.k8s.io", "v1", "resourceclaims", "ResourceClaim", True, (),
                 (STATUS,)),
    ResourceType("resource.k8s.io", "v1", "resourceclaimtemplates", "ResourceClaimTemplate",
                 True),
    # Stored and served, not enforced: the emulated API server authorises every request.
    ResourceType("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", False),
    ResourceType("rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding",
                 False),
    # Stored and served, not evaluated (no admission here): NVIDIA's DRA driver chart ships
    # one, which confines its plugin's service account to its own node's ResourceSlices.
    ResourceType("admissionregistration.k8s.io", "v1", "validatingadmissionpolicies",
                 "ValidatingAdmissionPolicy", False, (), (STATUS,)),
    ResourceType("admissionregistration.k8s.io", "v1", "validatingadmissionpolicybindings",
                 "ValidatingAdmissionPolicyBinding", False),
)

BY_KEY = {r.key: r for r in RESOURCES}


def find(group: str, version: str, plural: str) -> ResourceType | None:
    return BY_KEY.get(f"{group}/{version}/{plural}")


def by_kind(api_version: str, kind: str) -> ResourceType | None:
    return next((r for r in RESOURCES if r.api_version == api_version and r.kind == kind), None)


def groups() -> dict[str, list[str]]:
    """Named API groups -> versions served (the core group is not one of them)."""
    out: dict[str, list[str]] = {}
    for r in RESOURCES:
        if r.group and r.version not in out.setdefault(r.group, []):
            out[r.group].append(r.version)
    return out


def version_doc() -> dict:
    major, minor = KUBE_VERSION.split(".")
    return {
        "major": major, "minor": minor, "gitVersion": GIT_VERSION + "+gpuprov-lab",
        "gitCommit": "0000000000000000000000000000000000000000", "gitTreeState": "clean",
        "buildDate": "2025-04-23T00:00:00Z", "goVersion": "emulated", "compiler": "gc",
        "platform": "linux/amd64", "emulationMajor": major, "emulationMinor": minor,
    }


def core_versions_doc(server_address: str) -> dict:
    return {
        "kind": "APIVersions", "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0",
                                        "serverAddress": server_address}],
    }


def _group_doc(name: str, versions: list[str]) -> dict:
    gvs = [{"groupVersion": f"{name}/{v}", "version": v} for v in versions]
    return {"name": name, "versions": gvs, "preferredVersion": gvs[0]}


def group_list_doc() -> dict:
    return {"kind": "APIGroupList", "apiVersion": "v1",
            "groups": [_group_doc(g, v) for g, v in groups().items()]}


def group_doc(name: str) -> dict | None:
    versions = groups().get(name)
    if versions is None:
        return None
    return {"kind": "APIGroup", "apiVersion": "v1", **_group_doc(name, versions)}


def resource_list_doc(group: str, version: str) -> dict | None:
    served = [r for r in RESOURCES if r.group == group and r.version == version]
    if not served:
        return None
    entries = []
    for r in served:
        entry = {"name": r.plural, "singularName": r.singular, "namespaced": r.namespaced,
                 "kind": r.kind, "verbs": list(r.verbs)}
        if r.short_names:
            entry["shortNames"] = list(r.short_names)
        if r.categories:
            entry["categories"] = list(r.categories)
        entries.append(entry)
        for sub in r.subresources:
            sub_entry = {"name": f"{r.plural}/{sub.name}", "singularName": "",
                         "namespaced": r.namespaced, "kind": sub.kind or r.kind,
                         "verbs": list(sub.verbs)}
            if sub.group is not None:
                sub_entry["group"] = sub.group
                sub_entry["version"] = sub.version
            entries.append(sub_entry)
    gv = f"{group}/{version}" if group else version
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv,
            "resources": entries}
