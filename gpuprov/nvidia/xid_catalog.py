"""NVIDIA's XIDs as policy data: which ones mean the GPU is in trouble, and what NVIDIA says to do.

One table for `gpuprov verify` (gpu.xid reads FAULT_XIDS) and the health agent (which turns a
kernel-log XID into a fault, a counted application error, or a counted unknown). Read
2026-11-26 from these sources:

- NVIDIA's XID catalog for Ampere and newer GPUs, "Analyzing Xid Errors with the Xid Catalog"
  (https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html, the page's table and its
  Xid-Catalog.xlsx; NVIDIA's NVSentinel embeds that workbook with SHA-256
  7f70ce9684be0c9d98a367770341ccc1d8bca4465cebe42dab7e23d57df5d5a5,
  health-monitors/syslog-health-monitor/pkg/common/common.go @1275b0c). Its column
  "Resolution Bucket (Immediate Action)" is `bucket` below. Only the rows read here carry a
  bucket; None means "not read here", never "no action".
  Buckets read on the page: 8, 11 and 13 RESTART_APP. Buckets named by NVSentinel's own
  code for the rows they belong to (common.go @1275b0c, xid_catalog_consistency_test.go
  @897a4d2): 48 WORKFLOW_XID_48, 74 WORKFLOW_NVLINK_ERR, 144-150 WORKFLOW_NVLINK5_ERR,
  154 XID_154 (the action is printed in the XID's own line).
  79 RESTART_BM comes from NVSentinel's test mapping (syslog-health-monitor tests, the
  xiderrormappings.csv fixture), not from the page itself.
- NVIDIA's k8s-device-plugin, internal/rm/health.go (v0.20.x, read at 02597b9): the XIDs it
  never marks a GPU unhealthy for, "Application errors: the GPU should still be healthy":
  13, 31, 43, 45, 68, 109 (APP_XIDS_DEVICE_PLUGIN). The lab's emulated plugin follows it.
- source "gpuprov": gpuprov's reviewed list (verify's critical XIDs since issue 20), where no
  bucket was read here; a comment says why where it departs from the anchors.

Escalation: the same fault raised again after `escalate_after_reboots` reboots means the GPU
needs inspecting or replacing (gpud's threshold.go @v0.12.24 does the same after 2 reboots).
"""

from __future__ import annotations

import dataclasses

# What the agent does with an XID.
FAULT = "fault"  # the GPU is in trouble: a GPUFault condition until boot, reset or ack
APP = "app"  # an application's error: counted, no condition
UNKNOWN = "unknown"  # not in this table: counted, no condition, logged as news

CATALOG_URL = "https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html"
CATALOG_SHA256 = "7f70ce9684be0c9d98a367770341ccc1d8bca4465cebe42dab7e23d57df5d5a5"
DEVICE_PLUGIN_SOURCE = "NVIDIA/k8s-device-plugin internal/rm/health.go v0.20.x (02597b9)"

# health.go's ignoredXids, in its order.
APP_XIDS_DEVICE_PLUGIN = (13, 31, 43, 45, 68, 109)

ESCALATE_AFTER_REBOOTS = 2


@dataclasses.dataclass(frozen=True)
class Xid:
    xid: int
    name: str
    severity: str  # FAULT | APP
    bucket: str | None = None  # the catalog's immediate action, where read (see above)
    action: str = ""  # what an admin does, in words
    escalate_after_reboots: int | None = ESCALATE_AFTER_REBOOTS  # None: never escalates
    source: str = "catalog"  # catalog | device-plugin | gpuprov


_RESET = "drain the node, then reset the GPU (nvidia-smi -r) or reboot"
_REBOOT = "drain the node and reboot it; if it comes back, reseat or replace the GPU"

_TABLE = (
    Xid(8, "GPU stopped processing", APP, "RESTART_APP", "restart the application"),
    Xid(11, "invalid or corrupted push buffer stream", APP, "RESTART_APP",
        "restart the application"),
    Xid(13, "graphics engine exception", APP, "RESTART_APP", "restart the application"),
    Xid(31, "GPU memory page fault", APP, None, "check the application", source="device-plugin"),
    Xid(43, "GPU stopped processing", APP, None, "restart the application",
        source="device-plugin"),
    Xid(45, "preemptive cleanup, due to previous errors", APP, None,
        "look for the XID that came before it", source="device-plugin"),
    Xid(68, "video processor exception", APP, None, "restart the application",
        source="device-plugin"),
    # NMA (dcgm_policies.go @v1.7.0) treats 109 as critical; the device plugin and the
    # catalog's application class do not. Disputed: counted, no condition.
    Xid(109, "context switch timeout", APP, None, "restart the application",
        source="device-plugin"),
    Xid(48, "double-bit ECC error", FAULT, "WORKFLOW_XID_48", _RESET),
    Xid(61, "internal micro-controller breakpoint", FAULT, None, _RESET, source="gpuprov"),
    Xid(62, "internal micro-controller halt", FAULT, None, _RESET, source="gpuprov"),
    Xid(63, "ECC page retirement or row remapping event", FAULT, None,
        "reset the GPU to apply the remap", source="gpuprov"),
    Xid(64, "ECC page retirement or row remapper recording failure", FAULT, None,
        _RESET, source="gpuprov"),
    Xid(74, "NVLink error", FAULT, "WORKFLOW_NVLINK_ERR", _RESET),
    Xid(79, "GPU has fallen off the bus", FAULT, "RESTART_BM", _REBOOT),
    Xid(92, "high single-bit ECC error rate", FAULT, None, _RESET, source="gpuprov"),
    # A contained error kills the one application (on MIG: the one GPU instance); the driver
    # prints whether a reset is needed ("RST: Yes"). gpud raises its reboot threshold to
    # 1000 (threshold.go @v0.12.24): it does not escalate here either.
    Xid(94, "contained ECC error", FAULT, None, _RESET, escalate_after_reboots=None,
        source="gpuprov"),
    Xid(95, "uncontained ECC error", FAULT, None, _RESET, source="gpuprov"),
    Xid(119, "GSP RPC timeout", FAULT, None, _RESET, source="gpuprov"),
    Xid(120, "GSP error", FAULT, None, _RESET, source="gpuprov"),
    Xid(140, "unrecovered ECC error", FAULT, None, _RESET, source="gpuprov"),
    # Blackwell's NVLink unit errors (issue 20): named in nverror.h of NVIDIA's
    # open-gpu-kernel-modules 595.45.04; 146-148 and 150 are not added, no source here says
    # what they require.
    Xid(144, "NVLink SAW error", FAULT, "WORKFLOW_NVLINK5_ERR", _RESET),
    Xid(145, "NVLink RLW error", FAULT, "WORKFLOW_NVLINK5_ERR", _RESET),
    Xid(149, "NVLink NETIR error", FAULT, "WORKFLOW_NVLINK5_ERR", _RESET),
    # GPU_RECOVERY_ACTION_CHANGED (nverror.h, R570 and later): the line says which action.
    Xid(154, "GPU recovery action changed (reset or reboot required)", FAULT, "XID_154",
        "do what the XID 154 line says (reset, drain and reset, or reboot)"),
)

XIDS: dict[int, Xid] = {x.xid: x for x in _TABLE}

# verify's gpu.xid fails on these (the same set it had before this table, issue 20).
FAULT_XIDS: dict[int, str] = {x.xid: x.name for x in _TABLE if x.severity == FAULT}


def lookup(xid: int) -> Xid:
    """The policy for an XID; an XID not in the table is UNKNOWN (counted, no condition)."""
    return XIDS.get(xid) or Xid(xid, "not in gpuprov's XID table", UNKNOWN, None,
                                f"look XID {xid} up in NVIDIA's catalog ({CATALOG_URL})",
                                None, "none")
