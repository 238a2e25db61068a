"""Ansible module: evict named pods through the Kubernetes API and wait until they are gone.

The gpu_mig and nvidia_dra_driver roles evict a node's GPU pods
(gpuprov.stages.nvidia_dra_driver.gpu_pods chooses them) before they change the node's MIG
layout or its GPU allocation. kubernetes.core's k8s_drain evicts every pod of a node, chosen
by label only, and no module of that collection evicts single pods: hence this one, with the
kubernetes client the collection uses.
"""

from __future__ import annotations

import time

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
module: gpuprov_evict_pods
author: gpuprov maintainers
short_description: Evict named pods (policy/v1 Eviction) and wait for them to go
description:
  - Posts an Eviction for each pod, as C(kubectl drain) does, so that PodDisruptionBudgets are
    honoured; an eviction a budget refuses (HTTP 429) is tried again every 5 s.
  - Waits until every pod is gone (deleted, or Succeeded/Failed), or fails after I(timeout)
    seconds naming the pods left.
  - In check mode, reports the pods it would evict and evicts none.
options:
  pods:
    description: The pods, as C({namespace, name}) mappings.
    type: list
    elements: dict
    required: true
  kubeconfig:
    description: Kubeconfig file (default, the kubernetes client's own default).
    type: path
  context:
    description: Kubeconfig context (default, the current one).
    type: str
  timeout:
    description: Seconds to wait for the evictions to be allowed and the pods to go.
    type: int
    default: 300
"""

EXAMPLES = r"""
- name: Evict the node's GPU pods
  gpuprov_evict_pods:
    pods: "{{ pods.resources | gpuprov_allocation_gpu_pods(claims.resources) }}"
    kubeconfig: "{{ k8s_kubeconfig }}"
  delegate_to: localhost
"""

RETURN = r"""
evicted:
  description: The pods evicted, as namespace/name.
  returned: always
  type: list
  elements: str
"""

POLL = 1.0
RETRY_REFUSED = 5.0


def _gone(api, pod: dict) -> bool:
    from kubernetes.client.exceptions import ApiException

    try:
        found = api.read_namespaced_pod(pod["name"], pod["namespace"])
    except ApiException as exc:
        if exc.status == 404:
            return True
        raise
    return (found.status.phase or "") in ("Succeeded", "Failed")


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "pods": {"type": "list", "elements": "dict", "required": True},
            "kubeconfig": {"type": "path"},
            "context": {"type": "str"},
            "timeout": {"type": "int", "default": 300},
        },
        supports_check_mode=True,
    )
    pods = [{"namespace": str(p.get("namespace") or "default"), "name": str(p["name"])}
            for p in module.params["pods"] if p.get("name")]
    names = [f"{p['namespace']}/{p['name']}" for p in pods]
    if not pods or module.check_mode:
        module.exit_json(changed=bool(pods), evicted=names)
    try:
        from kubernetes import client, config
        from kubernetes.client.exceptions import ApiException
    except ImportError as exc:
        module.fail_json(msg=f"the kubernetes Python client is missing ({exc}): pip install "
                             f"kubernetes", evicted=[])
    try:
        api = client.CoreV1Api(config.new_client_from_config(
            config_file=module.params["kubeconfig"], context=module.params["context"]))
    except (config.ConfigException, OSError, ValueError) as exc:
        module.fail_json(msg=f"cannot use the kubeconfig: {exc}", evicted=[])
    deadline = time.monotonic() + module.params["timeout"]
    waiting = list(pods)  # evictions not yet accepted
    refused: dict[str, str] = {}
    while waiting and time.monotonic() < deadline:
        for pod in list(waiting):
            body = client.V1Eviction(metadata=client.V1ObjectMeta(
                name=pod["name"], namespace=pod["namespace"]))
            try:
                api.create_namespaced_pod_eviction(pod["name"], pod["namespace"], body)
            except ApiException as exc:
                if exc.status == 429:  # a PodDisruptionBudget allows none now
                    refused[f"{pod['namespace']}/{pod['name']}"] = "refused by its budget"
                    continue
                if exc.status != 404:
                    module.fail_json(msg=f"evicting {pod['namespace']}/{pod['name']}: HTTP "
                                         f"{exc.status} {exc.reason}", evicted=[])
            waiting.remove(pod)
        if waiting:
            time.sleep(RETRY_REFUSED)
    left = [f"{p['namespace']}/{p['name']}" for p in waiting]
    while not waiting:  # every eviction accepted: wait for the pods to go
        left = [f"{p['namespace']}/{p['name']}" for p in pods if not _gone(api, p)]
        if not left or time.monotonic() >= deadline:
            break
        time.sleep(POLL)
    if left:
        why = "; ".join(f"{name}: {refused.get(name, 'still running')}" for name in left)
        module.fail_json(msg=f"pods not gone {module.params['timeout']} s after their "
                             f"eviction: {why}", evicted=names)
    module.exit_json(changed=True, evicted=names)


if __name__ == "__main__":
    main()
