"""The bill of materials of a site: every package, repository, key, image and downloaded file
that site.yml needs on each node, for mirrors (air-gapped sites).

No second copy of site.yml's decisions: playbooks/bom.yml runs site.yml's own preflight and
validate stages and the roles' plans (nvidia_driver, nvidia_container_toolkit: their check
tasks; nvidia_device_plugin: its render tasks), then asks each node's apt what it would install
or upgrade for those plans now (`apt-get -s`: on a fresh node the whole dependency closure, at
the exact versions apt picks, NVIDIA's and the OS's), which part of the closure the node
already has (`apt-cache depends --recurse`, every alternative and provider, kept where
`apt-cache policy` says it is installed: alternatives as apt resolved them on that node; its
--installed option drops the providers of virtual packages), and where each version comes from
(`apt-cache policy`). An empty dpkg status
(simulating a bare node) was tried first and dropped: apt then picks alternatives a real node
does not (usrmerge for usr-is-merged, perl modules), packages no node gets. This module reads
the playbook's result (ansible.posix.json): parse_simulation(), parse_depends() and
parse_policy() read apt's output, node() builds one node's list, mirror() the de-duplicated
list over the nodes.

dnf nodes (RHEL family): the playbook asks dnf what it would install or upgrade for the same
plans (`dnf install --assumeno`: its transaction table, parse_dnf_transaction(), dnf 4 and dnf
5 formats) and reads the node's repository files (/etc/yum.repos.d/*.repo: parse_repo_files(),
each repository's baseurl and gpgkey); node_dnf() builds the node's list. NOT done for dnf
(unlike apt): the part of the closure a node already has and dnf leaves alone is not listed (on
a bare node the transaction is the whole closure). No RHEL node exists in the lab: the parsers
are tested on output recorded on real systems (tests/fixtures/bom/dnf/SOURCES.md).
"""

from __future__ import annotations

import configparser
import re
from collections.abc import Iterable, Mapping
from typing import Any

SCHEMA_VERSION = 1
# The playbook's last task, whose message is a node's raw materials.
RESULT_TASK = "Bill of materials"

# apt-get -s: "Inst libcuda1 (580.178.04-1 gpuprov-lab:/ [amd64])"; with a package already
# installed, its version in brackets first ("Inst bash [5.2.15-2+b8] (5.2.15-2+b13 ...)").
_INST = re.compile(r"^Inst (\S+) (?:\[[^\]]*\] )?\((\S+) (.*?) \[(\S+)\]\)")
# apt-cache policy: a package block starts unindented ("nvidia-smi:"), its version table lines
# are " *** 580.178.04-1 500" / "     580.105.08-1 500", each followed by its sources
# ("        500 file:/srv/... Packages", "        100 /var/lib/dpkg/status").
_POLICY_PACKAGE = re.compile(r"^(\S+):$")
_POLICY_VERSION = re.compile(r"^ (?:\*\*\*| {3}) (\S+) -?\d+$")
_POLICY_INSTALLED = re.compile(r"^  Installed: (\S+)$")
# parse_policy's key for a package's installed version (a list of one).
INSTALLED = "installed"
_POLICY_SOURCE = re.compile(r"^\s+-?\d+ (\S+)(?: (.*?))?\s+Packages$")


def parse_simulation(text: str | None) -> list[dict[str, str]]:
    """apt-get -s's Inst lines: [{name, version, origin, arch}], in apt's order."""
    out = []
    for line in (text or "").splitlines():
        match = _INST.match(line)
        if match:
            name, version, origin, arch = match.groups()
            out.append({"name": name, "version": version, "origin": origin, "arch": arch})
    return out


def parse_depends(text: str | None) -> list[str]:
    """apt-cache depends --recurse: the packages of the closure (unindented lines: apt recurses
    into every alternative and every provider of a virtual package; the virtual packages,
    "<name>", left out), in apt's order."""
    return [line.strip() for line in (text or "").splitlines()
            if line and not line[0].isspace() and not line.startswith("<")]


def parse_policy(text: str | None) -> dict[str, dict[str, list[str]]]:
    """apt-cache policy: package -> version -> ["URL SUITE/COMPONENT ARCH", ...] (the
    repositories that offer that version; dpkg's status file left out), and
    INSTALLED -> [the installed version] where one is."""
    out: dict[str, dict[str, list[str]]] = {}
    package = version = None
    for line in (text or "").splitlines():
        if match := _POLICY_PACKAGE.match(line):
            package, version = match.group(1), None
            out.setdefault(package, {})
        elif package and (match := _POLICY_INSTALLED.match(line)):
            if match.group(1) != "(none)":
                out[package].setdefault(INSTALLED, [match.group(1)])
        elif package and (match := _POLICY_VERSION.match(line)):
            version = match.group(1)
            out[package].setdefault(version, [])
        elif package and version and (match := _POLICY_SOURCE.match(line)):
            url, rest = match.group(1), (match.group(2) or "").strip()
            if not url.startswith("/"):  # /var/lib/dpkg/status: installed, not a repository
                out[package][version].append(f"{url} {rest}".strip())
    return out


# dnf's transaction table: section lines ("Installing:", "Installing dependencies:",
# "Upgrading:", "Updating for dependencies:" in yum's words) and package rows
# " NAME ARCH [EPOCH:]VERSION-RELEASE REPOSITORY SIZE"; dnf 5 adds "   replacing NAME ..." under
# an upgraded package. dnf 4 puts a name too long for its column on a line of its own.
_DNF_SECTION = re.compile(r"^([A-Z][A-Za-z ]+):$")
_DNF_TAKEN = ("Install", "Upgrad", "Updat", "Reinstall", "Downgrad")
_RPM_ARCHES = {"x86_64", "noarch", "i686", "i386", "aarch64", "ppc64le", "s390x"}


def parse_dnf_transaction(text: str | None) -> list[dict[str, str]]:
    """dnf's (or yum's) transaction table: [{name, version, arch, repository}] of what it would
    install, upgrade or downgrade, in its order; removals and "replacing" lines left out. A
    version keeps its epoch, except dnf 5's explicit "0:" (dnf 4 leaves it out)."""
    out: list[dict[str, str]] = []
    taken = True  # rows before any section line: the excerpt's own, counted as taken
    pending = ""
    for line in (text or "").splitlines():
        if line.startswith("Transaction Summary"):
            break
        if match := _DNF_SECTION.match(line):
            taken = match.group(1).startswith(_DNF_TAKEN)
            pending = ""
            continue
        fields = line.split()
        if not line.startswith(" ") or not fields or fields[0] == "replacing":
            continue
        if len(fields) == 1:
            pending = fields[0]  # dnf 4: the rest of the row is on the next line
            continue
        if pending:
            fields, pending = [pending, *fields], ""
        if len(fields) < 5 or fields[1] not in _RPM_ARCHES or not taken:
            continue
        name, arch, version, repository = fields[:4]
        out.append({"name": name, "version": version.removeprefix("0:"), "arch": arch,
                    "repository": repository})
    return out


def parse_repo_files(text: str | None, arch: str = "x86_64") -> dict[str, dict[str, Any]]:
    """The node's .repo files (concatenated, INI as dnf reads them): repository id ->
    {name, url (baseurl, else metalink or mirrorlist, with $basearch expanded), key (the first
    gpgkey; None where none), enabled, gpgcheck}. configparser is dnf's own format reader's
    model (libdnf reads the same INI); a section read twice keeps its last values."""
    parser = configparser.ConfigParser(interpolation=None, strict=False)
    parser.read_string(text or "")
    out = {}
    for repo_id in parser.sections():
        section = parser[repo_id]
        url = next((section[k].split()[0] for k in ("baseurl", "metalink", "mirrorlist")
                    if section.get(k, "").strip()), None)
        keys = (section.get("gpgkey") or "").replace(",", " ").split()
        out[repo_id] = {
            "name": section.get("name", repo_id),
            "url": url.replace("$basearch", arch).rstrip("/") if url else None,
            "key": keys[0].replace("$basearch", arch) if keys else None,
            "enabled": section.get("enabled", "1").strip().lower() in ("1", "true", "yes"),
            "gpgcheck": section.get("gpgcheck", "0").strip().lower() in ("1", "true", "yes"),
        }
    return out


def _key_for(repository: str, keys: Mapping[str, str | None]) -> str | None:
    """The key URL of the repository a package comes from (NVIDIA's, from the roles'
    settings), None for the OS's archive (its own keyring)."""
    for prefix, key in keys.items():
        if prefix and repository.startswith(prefix):
            return key
    return None


def _arch_expanded(url: str | None, arch: str) -> str | None:
    """nvidia_container_toolkit_repo_url's $(ARCH), as apt expands it in the sources file."""
    return url.replace("$(ARCH)", arch).rstrip("/") if url else None


def node(materials: Mapping[str, Any]) -> dict[str, Any]:
    """One node's bill of materials from the playbook's message for it."""
    installs = parse_simulation(materials.get("apt_simulate"))
    policy = parse_policy(materials.get("apt_policy"))
    new = {i["name"] for i in installs}
    # The closure's packages the node has and apt leaves as they are: at their installed
    # version (dpkg's architecture is not in policy's output; the node's own is assumed).
    arch = installs[0]["arch"] if installs else str(materials.get("arch") or "amd64")
    for name in parse_depends(materials.get("apt_depends")):
        have = policy.get(name, {}).get(INSTALLED)
        if name not in new and have:
            installs.append({"name": name, "version": have[0], "origin": None, "arch": arch})
            new.add(name)
    keys = {
        (materials.get("cuda_repo_url") or "").rstrip("/"): materials.get("cuda_repo_key_url"),
        _arch_expanded(materials.get("toolkit_repo_url"), arch) or "":
            materials.get("toolkit_repo_key_url"),
    }
    named = set(materials.get("driver_packages") or []) | {
        str(n).split("=")[0] for n in materials.get("toolkit_packages") or []}
    packages = []
    for item in installs:
        sources = policy.get(item["name"], {}).get(item["version"]) or []
        repository = sources[0] if sources else None
        packages.append({
            **{k: item[k] for k in ("name", "version", "arch")},
            "repository": repository,
            "key": _key_for(repository, keys) if repository else None,
            "named": item["name"] in named,  # a package the roles name (the rest: dependencies)
        })
    files = [url for url in (materials.get("cuda_repo_key_url"),
                             materials.get("toolkit_repo_key_url")) if url]
    used_keys = {p["key"] for p in packages if p["key"]}
    return {
        "os": materials.get("os"),
        "branch": materials.get("branch"),
        "driver_source": materials.get("driver_source"),
        "packages": packages,
        # Only the keys of repositories packages come from (the toolkit's key is downloaded
        # by the role whether or not apt takes a package from it).
        "files": [f for f in files if f in used_keys or f == materials.get("toolkit_repo_key_url")],
    }


def node_dnf(materials: Mapping[str, Any]) -> dict[str, Any]:
    """One dnf node's bill of materials: what dnf's transaction would install, each package
    with its repository's URL and key from the node's .repo files (a package from
    "@commandline" or a repository id no file names has none)."""
    installs = parse_dnf_transaction(materials.get("dnf_transaction"))
    arch = next((i["arch"] for i in installs if i["arch"] != "noarch"),
                str(materials.get("arch") or "x86_64"))
    repos = parse_repo_files(materials.get("dnf_repos"), arch)
    named = {str(n) for n in materials.get("driver_packages") or []} | {
        str(n) for n in materials.get("toolkit_packages") or []}
    packages = []
    for item in installs:
        repo = repos.get(item["repository"])
        packages.append({
            **{k: item[k] for k in ("name", "version", "arch")},
            "repository": repo["url"] if repo else None,
            "key": repo["key"] if repo else None,
            "named": item["name"] in named or any(n.startswith(item["name"] + "-")
                                                  for n in named),
        })
    return {
        "os": materials.get("os"),
        "branch": materials.get("branch"),
        "driver_source": materials.get("driver_source"),
        "packages": packages,
        # dnf fetches each repository's gpgkey itself: the mirror needs them.
        "files": sorted({p["key"] for p in packages if p["key"]}),
    }


def images(objects: Iterable[Mapping[str, Any]], extra: Iterable[str | None] = ()) -> list[str]:
    """Every container image of the rendered manifests (init containers too), and the
    others named (the smoke-test image), sorted, once each."""
    found = set()
    for obj in objects or ():
        spec = ((obj.get("spec") or {}).get("template") or {}).get("spec") or obj.get("spec") or {}
        for key in ("initContainers", "containers"):
            for container in spec.get(key) or []:
                if container.get("image"):
                    found.add(container["image"])
    found.update(i for i in extra if i)
    return sorted(found)


def mirror(nodes: Mapping[str, Mapping[str, Any]], image_list: list[str]) -> dict[str, Any]:
    """What a mirror must hold for these nodes, each item once."""
    packages: dict[tuple, dict] = {}
    repositories: dict[str, str | None] = {}
    files: set[str] = set()
    for record in nodes.values():
        for p in record["packages"]:
            packages.setdefault((p["name"], p["version"], p["arch"]),
                                {k: p[k] for k in ("name", "version", "arch", "repository")})
            if p["repository"]:
                repositories.setdefault(p["repository"], p["key"])
        files.update(record["files"])
    return {
        "repositories": [{"repository": r, "key": k} for r, k in sorted(repositories.items())],
        "packages": [packages[k] for k in sorted(packages)],
        "images": image_list,
        "files": sorted(files),
    }


def from_playbook(doc: Mapping[str, Any], rc: int) -> dict[str, Any]:
    """The bill of materials from playbooks/bom.yml's ansible.posix.json document: decided
    nodes, undecided ones (unreachable, failed by the preflight or the validate stage, or a
    package manager gpuprov cannot ask) with the reason, and the mirror list."""
    messages: dict[str, Mapping[str, Any]] = {}
    reasons: dict[str, str] = {}
    for play in doc.get("plays") or []:
        for task in play.get("tasks") or []:
            name = task["task"]["name"]
            for host, result in task["hosts"].items():
                if result.get("unreachable"):
                    reasons.setdefault(host, f"unreachable: {result.get('msg')}")
                elif result.get("failed"):
                    reasons.setdefault(host, f"{name}: {result.get('msg')}")
                elif name == RESULT_TASK and isinstance(result.get("msg"), Mapping):
                    messages[host] = result["msg"]
    objects: list = []
    smoke = None
    for materials in messages.values():
        objects = objects or list(materials.get("objects") or [])
        smoke = smoke or materials.get("smoke_image")
    nodes = {}
    for host, materials in sorted(messages.items()):
        if host in reasons or not materials.get("has_gpu"):
            continue
        if materials.get("apt_simulate") is not None:
            nodes[host] = node(materials)
        elif materials.get("dnf_transaction") is not None:
            nodes[host] = node_dnf(materials)
        else:
            reasons[host] = (f"package manager {materials.get('package_manager')!r}: no apt "
                             "or dnf answer for this node (gpuprov bom asks apt and dnf only)")
    image_list = images(objects, [smoke])
    return {"schema_version": SCHEMA_VERSION, "nodes": nodes,
            "undecided": dict(sorted(reasons.items())), "mirror": mirror(nodes, image_list),
            "playbook_rc": rc}
