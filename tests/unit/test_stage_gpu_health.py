"""The gpu_health role's decisions (gpuprov/stages/gpu_health.py)."""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import jinja2
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


# -- `gpuprov health remediate` as a service on a management host ------------------------------

REMEDIATE = {
    "gpu_health_remediate_enabled": True, "gpu_health_remediate_command": "/usr/local/bin/gpuprov",
    "gpu_health_remediate_kubeconfig": "/etc/gpuprov/remediate.kubeconfig",
    "gpu_health_remediate_context": None, "gpu_health_remediate_interval": 30,
    "gpu_health_remediate_max_unavailable": None, "gpu_health_remediate_taint": False,
    "gpu_health_remediate_drain": False, "gpu_health_remediate_plugin_namespace": "kube-system",
}
# An admin kubeconfig with its credentials inline, as `kubectl config view --raw --flatten`
# writes one (kubeadm's admin.conf has this shape).
ADMIN_CONF = KUBELET_CONF.replace(
    "    client-certificate: /var/lib/kubelet/pki/kubelet-client-current.pem\n"
    "    client-key: /var/lib/kubelet/pki/kubelet-client-current.pem\n",
    "    client-certificate-data: {c}\n    client-key-data: {c}\n".format(
        c=base64.b64encode(b"PEM").decode()))


def test_remediate_settings_defaults_pass_and_bad_ones_name_the_setting():
    assert gpu_health.remediate_check(REMEDIATE) == REMEDIATE
    # Removing the service needs none of the rest.
    off = {**REMEDIATE, "gpu_health_remediate_enabled": False,
           "gpu_health_remediate_kubeconfig": None}
    assert gpu_health.remediate_check(off) == off
    for key, value, words in [
            ("gpu_health_remediate_kubeconfig", None, "absolute path"),
            ("gpu_health_remediate_command", "gpuprov", "absolute path"),
            ("gpu_health_remediate_interval", 1, ">= 5"),
            ("gpu_health_remediate_interval", True, ">= 5"),
            ("gpu_health_remediate_max_unavailable", "ten%", "count"),
            ("gpu_health_remediate_max_unavailable", "-1", "count"),
            ("gpu_health_remediate_plugin_namespace", "Kube_System", "namespace"),
            ("gpu_health_remediate_taint", "yes", "true or false"),
            ("gpu_health_remediate_context", "", "context")]:
        with pytest.raises(ValueError, match=words) as exc:
            gpu_health.remediate_check({**REMEDIATE, key: value})
        assert key in str(exc.value)
    with pytest.raises(ValueError, match="unknown setting"):
        gpu_health.remediate_check({**REMEDIATE, "gpu_health_remediate_nonsense": 1})
    for good in ("3", 3, "10%", "0"):
        assert gpu_health.remediate_check({**REMEDIATE,
                                           "gpu_health_remediate_max_unavailable": good})


def test_remediate_exec_is_the_loop_with_every_option_as_systemd_reads_it():
    line = gpu_health.remediate_exec({**REMEDIATE, "gpu_health_remediate_context": "ops $HOME",
                                      "gpu_health_remediate_max_unavailable": "10%",
                                      "gpu_health_remediate_taint": True})
    assert line == ('/usr/local/bin/gpuprov health remediate --interval 30 --plugin-namespace '
                    'kube-system --context "ops $$HOME" --max-unavailable 10%% --taint '
                    '--kubeconfig ${CREDENTIALS_DIRECTORY}/kubeconfig')
    assert "--once" not in line and "--drain" not in line
    # Parsed back by the same rules (shlex's POSIX words, then systemd's %% and $$): the argv.
    import shlex
    words = [w.replace("%%", "%").replace("$$", "$") for w in shlex.split(line)]
    assert words[words.index("--context") + 1] == "ops $HOME"
    assert words[words.index("--max-unavailable") + 1] == "10%"


def test_remediate_kubeconfig_must_carry_its_credentials_inline():
    gpu_health.remediate_kubeconfig_check(ADMIN_CONF, "/etc/gpuprov/remediate.kubeconfig")
    with pytest.raises(ValueError, match=r"names other files \(cert_file, key_file\)"):
        gpu_health.remediate_kubeconfig_check(KUBELET_CONF, "/etc/kubernetes/kubelet.conf")
    with pytest.raises(ValueError, match="exec"):
        gpu_health.remediate_kubeconfig_check(ADMIN_CONF.replace(
            "    client-key-data:", "    exec: {command: aws}\n    x:"), "/k")


ROLE = Path(__file__).resolve().parents[2] / "roles" / "gpu_health"


def test_the_remediation_unit_passes_systemd_analyze_verify(tmp_path):
    """The unit as the role writes it, checked by systemd's own parser (no systemd running
    needed): every directive known, ExecStart's command executable."""
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("no systemd-analyze on this machine")
    command = shutil.which("true")
    settings = {**REMEDIATE, "gpu_health_remediate_command": command,
                "gpu_health_remediate_max_unavailable": "10%",
                "gpu_health_remediate_kubeconfig": str(tmp_path / "kubeconfig")}
    template = (ROLE / "templates" / "etc" / "systemd" / "system" /
                "gpuprov-health-remediate.service.j2").read_text()
    unit = jinja2.Template(template, undefined=jinja2.StrictUndefined).render(
        ansible_managed="test", __gpu_health_remediate_exec=gpu_health.remediate_exec(settings),
        **settings)
    path = tmp_path / "gpuprov-health-remediate.service"
    path.write_text(unit)
    run = subprocess.run([analyze, "verify", str(path)], capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 0, run.stderr
    assert "Unknown" not in run.stderr and "Ignoring" not in run.stderr, run.stderr


def _remediate_check_run(tmp_path: Path, kubeconfig: str, **extra) -> subprocess.CompletedProcess:
    """playbooks/health.yml in check mode on this machine as a management host (connection
    local): the role's real tasks, modules and filters, without molecule; check mode writes
    nothing."""
    root = Path(__file__).resolve().parents[2]
    path = tmp_path / "kubeconfig"
    path.write_text(kubeconfig)
    path.chmod(0o600)
    variables = {"gpu_health_remediate_host": True, "gpu_health_remediate_kubeconfig": str(path),
                 "gpu_health_remediate_command": shutil.which("true"),
                 "ansible_python_interpreter": sys.executable, **extra}
    return subprocess.run(
        [str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,", "-c",
         "local", "playbooks/health.yml", "--check", "--diff", "-e", json.dumps(variables)],
        cwd=root, capture_output=True, text=True, timeout=300,
        env={**os.environ, "ANSIBLE_CONFIG": str(root / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"})


UNIT = Path("/etc/systemd/system/gpuprov-health-remediate.service")


@pytest.mark.skipif(shutil.which("systemctl") is None, reason="needs systemctl (its version)")
def test_the_remediate_tasks_in_check_mode_without_molecule(tmp_path):
    existed = UNIT.exists()
    run = _remediate_check_run(tmp_path, ADMIN_CONF, gpu_health_remediate_max_unavailable="10%")
    assert run.returncode == 0, run.stdout[-3000:]
    assert "+ExecStart=" in run.stdout and "--max-unavailable 10%%" in run.stdout
    assert "--kubeconfig ${CREDENTIALS_DIRECTORY}/kubeconfig" in run.stdout
    assert f"LoadCredential=kubeconfig:{tmp_path / 'kubeconfig'}" in run.stdout
    assert "client-key-data" not in run.stdout  # the kubeconfig is never shown
    # Refused before the first change, one line naming what to change.
    run = _remediate_check_run(tmp_path, KUBELET_CONF)
    assert run.returncode != 0 and "names other files (cert_file, key_file)" in run.stdout
    assert "Install the remediation service's unit" not in run.stdout
    run = _remediate_check_run(tmp_path, ADMIN_CONF, gpu_health_remediate_interval=1)
    assert run.returncode != 0 and "gpu_health_remediate_interval must be" in run.stdout
    run = _remediate_check_run(tmp_path, ADMIN_CONF,
                               gpu_health_remediate_command="/nonexistent/gpuprov")
    assert run.returncode != 0 and "pip install gpuprov there" in run.stdout
    assert UNIT.exists() == existed  # check mode wrote nothing
