"""The gpu_health role's decisions (gpuprov/stages/gpu_health.py)."""

from __future__ import annotations

import base64
import json

import pytest

from gpuprov.node.health import agent
from gpuprov.stages import gpu_health

DEFAULTS = {
    "gpu_health_interval": 60, "gpu_health_heartbeat": 300, "gpu_health_clear_after_passes": 3,
    "gpu_health_kubelet_kubeconfig": "/etc/kubernetes/kubelet.conf",
    "gpu_health_textfile_dir": "/var/lib/node_exporter/textfile_collector",
    "gpu_health_state_dir": "/var/lib/gpuprov/health",
    "gpu_health_install_dir": "/usr/local/lib/gpuprov",
}

# A kubelet kubeconfig as kubeadm writes it (kubeadm's kubelet.conf after TLS bootstrap:
# kubernetes/kubernetes cmd/kubeadm/app/phases/kubeconfig, the client certificate pointing at
# the kubelet's rotating pem).
KUBELET_CONF = """\
apiVersion: v1
clusters:
- cluster:
    certificate-authority-data: {ca}
    server: https://10.0.0.1:6443
  name: kubernetes
contexts:
- context:
    cluster: kubernetes
    user: system:node:gpu-1
  name: system:node:gpu-1@kubernetes
current-context: system:node:gpu-1@kubernetes
kind: Config
preferences: {{}}
users:
- name: system:node:gpu-1
  user:
    client-certificate: /var/lib/kubelet/pki/kubelet-client-current.pem
    client-key: /var/lib/kubelet/pki/kubelet-client-current.pem
""".format(ca=base64.b64encode(b"-----BEGIN CERTIFICATE-----\nCA\n").decode())


def test_defaults_pass_and_bad_settings_name_the_setting():
    assert gpu_health.check(DEFAULTS) == DEFAULTS
    for key, value, words in [("gpu_health_interval", 0, "positive"),
                              ("gpu_health_interval", True, "positive"),
                              ("gpu_health_heartbeat", 10, "at least gpu_health_interval"),
                              ("gpu_health_state_dir", "var/lib", "absolute"),
                              ("gpu_health_textfile_dir", "tf", "absolute")]:
        with pytest.raises(ValueError, match=words) as exc:
            gpu_health.check({**DEFAULTS, key: value})
        assert key in str(exc.value)
    assert gpu_health.check({**DEFAULTS, "gpu_health_textfile_dir": None})


def test_kube_access_from_a_kubeadm_kubelet_conf_keeps_the_rotating_paths():
    access = gpu_health.kube_access(KUBELET_CONF, "/etc/kubernetes/kubelet.conf")
    assert access == {"server": "https://10.0.0.1:6443",
                      "ca_data": "-----BEGIN CERTIFICATE-----\nCA\n",
                      "cert_file": "/var/lib/kubelet/pki/kubelet-client-current.pem",
                      "key_file": "/var/lib/kubelet/pki/kubelet-client-current.pem"}


def test_kube_access_relative_paths_and_refusals():
    text = KUBELET_CONF.replace("/var/lib/kubelet/pki/kubelet-client-current.pem", "pki/k.pem")
    assert gpu_health.kube_access(text, "/etc/kubernetes/kubelet.conf")["cert_file"] == \
        "/etc/kubernetes/pki/k.pem"
    with pytest.raises(ValueError, match="current-context"):
        gpu_health.kube_access("apiVersion: v1\n", "/k")
    with pytest.raises(ValueError, match="exec"):
        gpu_health.kube_access(KUBELET_CONF.replace(
            "    client-key: /var/lib/kubelet/pki/kubelet-client-current.pem",
            "    exec: {command: aws}"), "/k")


def test_agent_config_is_one_the_agent_loads(tmp_path):
    config = gpu_health.agent_config(
        "gpu-1", DEFAULTS, {"server": "https://x"},
        {"gpu_mig_config": "all-1g.10gb", "nvidia_container_toolkit_mode": "cdi",
         "gpu_node_labels_node_name": "gpu-1.example"})
    assert config["node_name"] == "gpu-1.example"
    assert config["settings"] == {"gpu_expected": True, "mig_config": "all-1g.10gb",
                                  "toolkit_mode": "cdi"}
    path = tmp_path / "health.json"
    path.write_text(json.dumps(config))
    loaded = agent.Config.load(str(path))
    assert loaded.interval_s == 60 and loaded.kube == {"server": "https://x"}
