"""Host checks: the probe reached the node, and no CUDA toolkit on it."""

from __future__ import annotations

from gpuprov.verify.facts import NodeFacts
from gpuprov.verify.findings import Verdict, check, passed, problem, skipped

PROBE_CHECK = "host.probe"


@check(
    PROBE_CHECK,
    phase="node",
    severity="error",
    gpu_only=False,
    description="gpuprov's probe runs on the node over SSH (or locally) and reports",
    remediation="make the node reachable as the inventory says (ansible -m ping NODE), "
    "with python3 >= 3.9 on it",
)
def probe_ran(facts: NodeFacts) -> Verdict:
    # The runner reports unreachable nodes and failed probes itself (it has no report then).
    probe = facts.report.get("probe") or {}
    broken = sorted((probe.get("errors") or {}).items())
    if broken:
        return problem(
            "probe sections failed: " + "; ".join(f"{k}: {v.get('message')}" for k, v in broken),
            errors=dict(broken),
        )
    return passed(f"probe {probe.get('version')} ran in {probe.get('duration_s')} s")


@check(
    "host.no-cuda-toolkit",
    phase="node",
    severity="error",
    gpu_only=False,
    description="no CUDA toolkit is installed on the host: CUDA lives in container images",
    remediation="remove the CUDA toolkit packages (apt-get purge 'cuda-toolkit*' "
    "nvidia-cuda-toolkit / dnf remove 'cuda-toolkit*'); images bring their own CUDA",
)
def no_cuda_toolkit(facts: NodeFacts) -> Verdict:
    packages = facts.report.get("packages") or {}
    if packages.get("manager") is None:
        return skipped("no dpkg or rpm database on the node")
    if packages.get("error"):
        return skipped(f"package list unreadable: {packages['error']}")
    toolkit = packages.get("cuda_toolkit") or []
    if toolkit:
        names = ", ".join(f"{p['name']} {p.get('version')}" for p in toolkit)
        return problem(f"CUDA toolkit installed on the host: {names}",
                       packages=[p["name"] for p in toolkit])
    return passed(f"no CUDA toolkit package ({packages['manager']})")


def _trusted(module: dict, keys: list[str]) -> str | None:
    """The trusted key that signed the module: the key's description names the signer
    ("Debian Secure Boot CA: 6ccece7e..."), or ends with the signature's key id."""
    signer = (module.get("signer") or "").strip()
    key_id = (module.get("sig_key") or "").replace(":", "").lower()
    for key in keys:
        name, _, ident = key.partition(":")
        ident = ident.split()[0].rstrip(":").lower() if ident.split() else ""
        if (signer and name.strip() == signer) or (key_id and ident.endswith(key_id)):
            return key
    return None


MOK_STEPS = ("sign DKMS builds with a Machine Owner Key (nvidia_driver_secure_boot_sign: true "
             "in the nvidia_driver role), enroll it with `mokutil --import <certificate>`, "
             "reboot and confirm the enrolment in MokManager on the console")


@check(
    "host.secure-boot",
    phase="node",
    severity="error",
    description="with Secure Boot on, the nvidia module the node boots next is signed by a key "
    "the kernel trusts (built-in, or a Machine Owner Key); off: nothing to check",
    remediation=MOK_STEPS,
)
def secure_boot(facts: NodeFacts) -> Verdict:
    boot = facts.report.get("boot") or {}
    state = boot.get("secure_boot")
    if state is None:
        return passed("Secure Boot not in use (no SecureBoot EFI variable: BIOS boot, or "
                      "EFI variables hidden)")
    if state is False:
        return passed("Secure Boot off: the kernel loads unsigned modules")
    kernel = boot.get("next_kernel") or boot.get("running_kernel")
    module = (boot.get("modules") or {}).get(kernel)
    if module is None:
        return skipped(f"Secure Boot on; kernel {kernel} has no nvidia module to check "
                       "(driver.next-boot says why)")
    details = {"kernel": kernel, "module": module["path"], "signer": module.get("signer")}
    if not module.get("signed"):
        return problem(f"Secure Boot on and {module['path']} (kernel {kernel}) is unsigned: "
                       f"the kernel will refuse to load it; {MOK_STEPS}", **details)
    key = _trusted(module, list(boot.get("trusted_keys") or []))
    if key is None:
        return problem(f"Secure Boot on and {module['path']} is signed by "
                       f"{module.get('signer') or '?'} (key {module.get('sig_key') or '?'}), a "
                       f"key the kernel does not trust: {MOK_STEPS}", **details)
    return passed(f"Secure Boot on; {module['path']} signed by {module.get('signer')}, "
                  f"trusted ({key})", **details)
