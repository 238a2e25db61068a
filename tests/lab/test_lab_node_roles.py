"""What the molecule scenarios of the node roles (molecule/nvidia_driver,
molecule/nvidia_container_toolkit, molecule/gpu_stages) asserted and the lab tests did not yet,
asserted here on the session lab after its first site.yml (issue 30).

Molecule converges each role apart, on containers of the lab's node image, with stand-ins for
the stages before it (preflight facts set by hand, no driver or toolkit under the plugin). The
lab runs all of site.yml over SSH on four nodes (Debian 12 and 13, containerd 1.6 and 2.x,
Debian's and NVIDIA's driver), so the same assertions hold here on the whole chain, and cost
reads over SSH and the API instead of three more sets of containers converged. What the lab
cannot show stays in molecule; molecule/README.md says what and why, assertion by assertion.

Expected names, paths and values are written out, not read from the roles or gpuprov, so that
a wrong one in them fails; what the tests can measure (the packages before site.yml, the
admin's planted containerd settings, the repository's key) is measured.
"""

from __future__ import annotations

import re
import time

import pytest
import tomllib
from conftest import (
    PACKAGES_BEFORE_SITE,
    PLANTED_CONTAINERD,
    SECURE_BOOT_NODE,
    installed_packages,
    kube_api,
    playbook_failures,
)
from kubernetes import client

from gpuprov.lab import pkgrepo
from gpuprov.payload import run_probe

GPU_NODES = ("gpu-kepler", "gpu-pascal", "gpu-hopper")
NODES = (*GPU_NODES, "cpu-only")
# The nodes whose driver comes from Debian's archive (Debian 12); gpu-hopper takes NVIDIA's.
DEBIAN_DRIVER = {"gpu-kepler": ["nvidia-tesla-470-kernel-dkms", "libnvidia-tesla-470-ml1"],
                 "gpu-pascal": ["nvidia-kernel-dkms", "libnvidia-ml1"]}
CONTAINERD_MAJOR = {"gpu-kepler": 1, "gpu-pascal": 1, "gpu-hopper": 2}


@pytest.fixture(scope="module")
def converged(site_run):
    rc, doc = site_run
    assert rc == 0, playbook_failures(doc)
    return doc


def _run(conn, command: str) -> str:
    return conn.run(command, hide=True, in_stream=False).stdout


# -- nvidia_driver (molecule/nvidia_driver/verify.yml) -----------------------------------------

# The goal for the compute-only driver, against Debian's nvidia-driver metapackage (141).
MAX_NEW_PACKAGES = 75


@pytest.mark.parametrize("node", list(DEBIAN_DRIVER))
def test_site_yml_adds_at_most_75_packages_to_a_debian_driver_node(converged, node_connection,
                                                                  node):
    # Everything site.yml added, the toolkit's packages included: molecule counted the driver
    # role's alone, so this bound is at least as tight.
    before = PACKAGES_BEFORE_SITE[node]
    after = installed_packages(node_connection(node))
    added = sorted(set(after) - set(before))
    # The count measured a driver install, not two reads of the same package list.
    assert set(DEBIAN_DRIVER[node]) <= set(added), f"driver not among the added: {added}"
    assert len(added) <= MAX_NEW_PACKAGES, f"{len(added)} packages added: {added}"
    # The figure itself, as molecule's verify.yml reported it (pytest -rP shows it).
    print(f"{node}: site.yml added {len(added)} packages (at most {MAX_NEW_PACKAGES})")


def test_site_yml_adds_no_package_to_the_cpu_node(converged, node_connection):
    after = installed_packages(node_connection("cpu-only"))
    assert PACKAGES_BEFORE_SITE["cpu-only"], "bare_lab recorded no packages"
    assert sorted(set(after) - set(PACKAGES_BEFORE_SITE["cpu-only"])) == []


# Compute only: CUDA lives in the container images, and a GPU server has no display.
FORBIDDEN = re.compile(r"^(cuda-toolkit.*|nvidia-cuda-toolkit|xserver-xorg-core|xserver-xorg)$")


@pytest.mark.parametrize("node", NODES)
def test_no_cuda_toolkit_and_no_x_server(converged, node_connection, node):
    packages = installed_packages(node_connection(node))
    assert sorted(p for p in packages if FORBIDDEN.match(p)) == []


@pytest.mark.parametrize("node", NODES)
def test_nouveau_is_blacklisted_on_gpu_nodes_only(converged, node_connection, node):
    conn = node_connection(node)
    # modprobe's own reading of every file it reads (Debian's driver packages may blacklist
    # nouveau too), and the role's own file, which must not depend on them.
    effective = _run(conn, "modprobe --showconfig").splitlines()
    if node not in GPU_NODES:
        assert "blacklist nouveau" not in effective
        return
    assert "blacklist nouveau" in effective
    role_file = conn.run("cat /etc/modprobe.d/blacklist-nouveau.conf", hide=True,
                         in_stream=False, warn=True)
    assert "blacklist nouveau" in role_file.stdout.splitlines(), role_file.stderr


@pytest.mark.parametrize("node", GPU_NODES)
def test_nvidia_persistenced_is_enabled(converged, node_connection, node):
    state = node_connection(node).run("systemctl is-enabled nvidia-persistenced", hide=True,
                                      in_stream=False, warn=True)
    assert state.stdout.strip() == "enabled", state.stdout + state.stderr


def _checksums(node_state: str) -> dict[str, str]:
    """path -> sha256 from conftest.node_state()'s output (its sha256sum lines)."""
    sums = {}
    for line in node_state.splitlines():
        digest, _, path = line.partition("  ")
        if re.fullmatch(r"[0-9a-f]{64}", digest) and path.startswith("/"):
            sums[path] = digest
    return sums


@pytest.mark.parametrize("node", GPU_NODES)
def test_the_nodes_apt_sources_are_untouched(converged, bare_check_run, node_connection, node):
    # Every apt source the node had before site.yml (read by bare_check_run, before any run),
    # byte for byte: the role adds its own files beside them.
    before = {path: digest for path, digest in _checksums(bare_check_run.nodes_before[node])
              .items() if re.fullmatch(r"/etc/apt/sources\.list(\.d/.*)?", path)}
    assert "/etc/apt/sources.list" in before or any(
        p.startswith("/etc/apt/sources.list.d/") for p in before), before
    now = node_connection(node).run(f"sha256sum {' '.join(sorted(before))}", hide=True,
                                    in_stream=False, warn=True)
    assert _checksums(now.stdout) == before, now.stderr


def _origins_of_installed(policy: str) -> list[list[str]]:
    """The sources `apt-cache policy` lists under the installed version (its *** line), each
    split into words: [URI, (suite/component,) (arch,) "Packages"] or the dpkg status file."""
    lines = policy.splitlines()
    start = next(i for i, line in enumerate(lines) if line.lstrip().startswith("*** "))
    origins = []
    for line in lines[start + 1:]:
        found = re.match(r"\s+\d+ (\S.*)$", line)  # a priority and a source; a version ends it
        if not found:
            break
        origins.append(found.group(1).split())
    return origins


def _deb822(text: str) -> dict[str, str]:
    fields = {}
    for line in text.splitlines():
        if ":" in line and not line.startswith((" ", "#")):
            key, _, value = line.partition(":")
            fields[key] = value.strip()
    return fields


@pytest.mark.parametrize("node", list(DEBIAN_DRIVER))
def test_non_free_is_added_in_a_source_of_its_own_signed_by_debians_key(
        converged, node_connection, node):
    conn = node_connection(node)
    source = _deb822(_run(conn, "cat /etc/apt/sources.list.d/gpuprov-nvidia-debian.sources"))
    assert "non-free" in source["Components"].split(), source
    assert source["Signed-By"] == "/usr/share/keyrings/debian-archive-keyring.gpg", source
    # And the installed driver is non-free's: apt lists non-free under the installed version.
    policy = _run(conn, f"apt-cache policy {DEBIAN_DRIVER[node][0]}")
    origins = _origins_of_installed(policy)
    assert any(len(o) > 1 and o[1].endswith("/non-free") for o in origins), policy


MOK_CONF = "/etc/dkms/framework.conf.d/gpuprov-mok.conf"
MOK_KEY, MOK_CERT = "/var/lib/dkms/mok.key", "/var/lib/dkms/mok.pub"


def test_dkms_signs_with_a_root_only_key_pair_where_secure_boot_signing_is_on(
        converged, node_connection):
    conn = node_connection(SECURE_BOOT_NODE)
    conf = _run(conn, f"cat {MOK_CONF}").splitlines()
    assert f'mok_signing_key="{MOK_KEY}"' in conf and f'mok_certificate="{MOK_CERT}"' in conf
    modes = dict(line.split(" ", 1) for line in _run(
        conn, f"stat -c '%n %a %U' {MOK_KEY} {MOK_CERT}").splitlines())
    assert modes[MOK_KEY] == "600 root", modes
    # A pair DKMS can sign with: the certificate (DER, what mokutil enrolls) carries the
    # private key's public half.
    pair = _run(conn, f"openssl pkey -in {MOK_KEY} -pubout; "
                      f"openssl x509 -inform DER -in {MOK_CERT} -noout -pubkey")
    keys = re.findall(r"-----BEGIN PUBLIC KEY-----\n.*?-----END PUBLIC KEY-----", pair, re.S)
    assert len(keys) == 2 and keys[0] == keys[1], pair


@pytest.mark.parametrize("node", [n for n in GPU_NODES if n != SECURE_BOOT_NODE])
def test_no_dkms_signing_drop_in_where_secure_boot_signing_is_off(converged, node_connection,
                                                                  node):
    missing = node_connection(node).run(f"test -e {MOK_CONF}", hide=True, in_stream=False,
                                        warn=True)
    assert missing.failed, f"{MOK_CONF} on {node}, which does not ask for signing"


# -- nvidia_container_toolkit (molecule/nvidia_container_toolkit/verify.yml) -------------------

KEYRING = "/usr/share/keyrings/nvidia-container-toolkit-keyring.gpg"
TOOLKIT_SOURCE = "/etc/apt/sources.list.d/nvidia-container-toolkit.sources"


@pytest.mark.parametrize("node", GPU_NODES)
def test_the_installed_toolkit_comes_from_the_local_repository(converged, node_connection,
                                                               node):
    policy = _run(node_connection(node), "apt-cache policy nvidia-container-toolkit")
    installed = next(line.split()[1] for line in policy.splitlines()
                     if line.lstrip().startswith("*** "))
    assert installed == pkgrepo.TOOLKIT_VERSION, policy
    # The repository (the inventory's URL, for this architecture) offers the installed version.
    repo = pkgrepo.REPO_URL.replace("$(ARCH)", pkgrepo.ARCH)
    assert [repo, "Packages"] in _origins_of_installed(policy), policy


@pytest.mark.parametrize("node", GPU_NODES)
def test_the_toolkit_source_is_nvidias_layout_signed_by_the_repositorys_key_only(
        converged, node_connection, node):
    conn = node_connection(node)
    source = _deb822(_run(conn, f"cat {TOOLKIT_SOURCE}"))
    assert source["URIs"] == pkgrepo.REPO_URL and source["Suites"] == "/", source
    assert source["Signed-By"] == KEYRING, source
    # A throwaway GNUPGHOME: reading two key files writes nothing in root's home.
    fingerprints = [re.findall(r"^fpr:+([0-9A-F]{40}):", _run(
        conn, f"GNUPGHOME=$(mktemp -d) gpg --batch --show-keys --with-colons {path}"), re.M)
        for path in (KEYRING, f"{pkgrepo.NODE_PATH}/gpgkey")]
    assert fingerprints[0] and fingerprints[0] == fingerprints[1], fingerprints
    # Dearmored, as apt wants a .gpg keyring: binary OpenPGP's first byte is a packet tag,
    # which has bit 7 set (RFC 4880, 4.2); ASCII armour starts with "-----".
    first = _run(conn, f"head -c 1 {KEYRING} | od -An -tu1").split()
    assert first and int(first[0]) & 0x80, first


@pytest.mark.parametrize("node", GPU_NODES)
def test_apt_verifies_the_toolkit_repositorys_signature(converged, node_connection, node):
    # Only the toolkit's source, so that the check does not depend on Debian's mirror.
    update = node_connection(node).run(
        f"apt-get update -o Dir::Etc::SourceList={TOOLKIT_SOURCE} "
        "-o Dir::Etc::SourceParts=/nonexistent -o APT::Get::List-Cleanup=0",
        hide=True, in_stream=False, warn=True)
    out = update.stdout + update.stderr
    assert update.ok, out
    assert not any(words in out for words in ("NO_PUBKEY", "not signed", "W:")), out


def _flatten(table: dict, prefix: tuple = ()) -> dict[tuple, object]:
    flat = {}
    for key, value in table.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, (*prefix, key)))
        else:
            flat[(*prefix, key)] = value
    return flat


@pytest.mark.parametrize("node", GPU_NODES)
def test_containerd_keeps_every_planted_setting_and_runc(converged, node_connection, node):
    dump = tomllib.loads(_run(node_connection(node), "containerd config dump"))
    planted = tomllib.loads(PLANTED_CONTAINERD)
    if CONTAINERD_MAJOR[node] == 1:
        # containerd 1.x reads the version 2 file as it is: each planted key in effect as set.
        got = _flatten(dump)
        missing = {k: v for k, v in _flatten(planted).items() if got.get(k) != v}
        assert missing == {}, missing
        cri = dump["plugins"]["io.containerd.grpc.v1.cri"]
    else:
        # 2.x migrates the CRI keys into its version 3 plugins (test_site_playbook checks
        # them); outside the CRI plugin the planted settings keep their place.
        assert dump["oom_score"] == planted["oom_score"]
        opt = "io.containerd.internal.v1.opt"
        assert dump["plugins"][opt]["path"] == planted["plugins"][opt]["path"]
        cri = dump["plugins"]["io.containerd.cri.v1.runtime"]
    runtimes = cri["containerd"]["runtimes"]
    assert runtimes["runc"]["runtime_type"] == "io.containerd.runc.v2", runtimes
    assert runtimes["nvidia"]["runtime_type"] == "io.containerd.runc.v2", runtimes


@pytest.mark.parametrize("node", GPU_NODES)
def test_config_toml_keeps_the_admins_text_imports_the_drop_in_and_was_backed_up(
        converged, node_connection, node):
    conn = node_connection(node)
    text = _run(conn, "cat /etc/containerd/config.toml")
    imports = [line for line in text.splitlines() if line.startswith("imports")]
    assert imports == ['imports = ["/etc/containerd/conf.d/99-nvidia.toml"]'], text
    # Only the import added: the admin's text, line for line, is what is left.
    assert text.replace(imports[0] + "\n", "", 1) == PLANTED_CONTAINERD, text
    # One backup, of the file as the admin left it (the role changed it once).
    backups = _run(conn, "ls /etc/containerd/").split()
    backups = [b for b in backups if b.startswith("config.toml.") and b.endswith("~")]
    assert len(backups) == 1, backups
    assert _run(conn, f"cat /etc/containerd/{backups[0]}") == PLANTED_CONTAINERD


RUNTIME_MODE = {"gpu-kepler": "legacy", "gpu-pascal": "legacy", "gpu-hopper": "cdi"}


@pytest.mark.parametrize("node", GPU_NODES)
def test_the_probe_recognises_what_the_toolkit_role_wrote(converged, node_connection, node):
    # The probe that gpu_preflight and `gpuprov verify` run, and the lab's device plugin trusts.
    report = run_probe(node_connection(node), timeout=60)
    found = report["container_runtime"]["containerd"]
    assert found["nvidia_runtime"] is True, found
    assert found["default_is_nvidia"] is (RUNTIME_MODE[node] == "legacy"), found
    # containerd 1.x replaces each imported plugin table whole, which the role's drop-in is
    # written for. (On 2.x the probe, reading files and not the binary, takes the planted
    # version 2 config.toml with that stricter rule too: not asserted, as it is no fact of 2.x.)
    if CONTAINERD_MAJOR[node] == 1:
        assert found["import_merge"] == "replace-plugin-tables", found
    assert {"runc", "nvidia"} <= set(found["runtimes"]), found
    binaries = report["container_runtime"]["binaries"]
    assert binaries["nvidia-container-runtime"] == "/usr/bin/nvidia-container-runtime", binaries


def _eventually(read, want, timeout: float = 60.0):
    """read() as soon as it equals want, else its last value after timeout (for the assertion
    to show)."""
    deadline = time.monotonic() + timeout
    while (got := read()) != want and time.monotonic() < deadline:
        time.sleep(0.5)
    return got


# -- gpu_preflight, gpu_node_labels, nvidia_device_plugin (molecule/gpu_stages/verify.yml) ---

# What gpu_preflight finds and chooses per node, written out: (GPU count, model names, driver
# branch, open kernel modules supported, open kernel modules required).
PREFLIGHT = {
    "gpu-kepler": (2, ["Tesla K80"], 470, False, False),
    "gpu-pascal": (4, ["Tesla P100-PCIE-16GB"], 535, False, False),
    "gpu-hopper": (8, ["NVIDIA H100 80GB HBM3"], 580, True, False),
    "cpu-only": (0, [], None, False, False),
}


def _facts(doc: dict, play_prefix: str) -> dict[str, dict]:
    """host -> the facts the tasks of the plays named play_prefix* set, in the run's order."""
    facts: dict[str, dict] = {}
    for play in doc["plays"]:
        if not play["play"]["name"].startswith(play_prefix):
            continue
        for task in play["tasks"]:
            for host, result in task["hosts"].items():
                facts.setdefault(host, {}).update(result.get("ansible_facts") or {})
    return facts


@pytest.mark.parametrize("node", NODES)
def test_the_preflights_facts_for_the_later_stages(converged, node):
    facts = {key: value for key, value in _facts(converged, "Preflight")[node].items()
             if key.startswith("gpu_preflight_") and key != "gpu_preflight_probe"}
    count, names, branch, open_supported, open_required = PREFLIGHT[node]
    assert facts["gpu_preflight_has_gpu"] is (count > 0), facts
    assert int(facts["gpu_preflight_gpu_count"]) == count
    gpus = facts["gpu_preflight_gpus"]
    assert len(gpus) == count and sorted({g["name"] for g in gpus}) == names, gpus
    assert facts["gpu_preflight_driver_branch"] == branch
    assert facts["gpu_preflight_open_kernel_modules_supported"] is open_supported
    assert facts["gpu_preflight_open_kernel_modules_required"] is open_required


def test_every_node_has_its_hostname_label_and_gpus_as_capacity(converged, lab):
    core = client.CoreV1Api(kube_api(lab))

    def nodes():
        return {n.metadata.name: (n.metadata.labels.get("kubernetes.io/hostname"),
                                  (n.status.capacity or {}).get("nvidia.com/gpu"),
                                  (n.status.allocatable or {}).get("nvidia.com/gpu"))
                for n in core.list_node().items}

    # Whole GPUs as capacity and allocatable on the GPU nodes, none on the CPU node (waited
    # for: the plugin re-registers within seconds after a test that restarted it).
    want = {name: (name, *((str(gpus),) * 2 if gpus else (None, None)))
            for name, (gpus, *_) in PREFLIGHT.items()}
    assert _eventually(nodes, want) == want


# Written out, not read from the role's defaults: a wrong image or name there fails.
PLUGIN_IMAGE = "nvcr.io/nvidia/k8s-device-plugin:v0.20.1"


def test_the_device_plugin_daemonset(converged, lab):
    apps = client.AppsV1Api(kube_api(lab))
    found = apps.list_namespaced_daemon_set(
        "kube-system", field_selector="metadata.name=nvidia-device-plugin-daemonset").items
    assert len(found) == 1, [d.metadata.name for d in found]
    pod = found[0].spec.template.spec
    # The plugin and NVIDIA's config-manager sidecar (the node's named config).
    assert [c.name for c in pod.containers] == ["nvidia-device-plugin-sidecar",
                                                "nvidia-device-plugin-ctr"]
    assert {c.image for c in pod.containers} == {PLUGIN_IMAGE}
    assert pod.priority_class_name == "system-node-critical"
    assert pod.runtime_class_name == "nvidia"
    assert pod.node_selector == {"nvidia.com/gpu.present": "true"}

    # Scheduled and ready on the GPU nodes only (a test before this one may have had the
    # plugin's pods replaced: the MIG stage pauses the plugin on a node while it partitions).
    def counts():
        status = apps.read_namespaced_daemon_set("nvidia-device-plugin-daemonset",
                                                 "kube-system").status
        return status.desired_number_scheduled, status.number_ready

    assert _eventually(counts, (len(GPU_NODES),) * 2) == (len(GPU_NODES),) * 2


def test_one_running_plugin_pod_per_gpu_node(converged, lab):
    core = client.CoreV1Api(kube_api(lab))

    def pods():
        found = core.list_namespaced_pod("kube-system",
                                         label_selector="name=nvidia-device-plugin-ds").items
        return sorted((p.spec.node_name, p.status.phase) for p in found)

    want = [(node, "Running") for node in sorted(GPU_NODES)]
    assert _eventually(pods, want) == want


def test_the_nvidia_runtime_class(converged, lab):
    classes = client.NodeV1Api(kube_api(lab)).list_runtime_class().items
    assert [(r.metadata.name, r.handler) for r in classes if r.metadata.name == "nvidia"] == \
        [("nvidia", "nvidia")]
