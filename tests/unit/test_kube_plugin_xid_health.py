"""The emulated device plugin's health check follows NVIDIA's v0.20.x (internal/rm/health.go,
internal/plugin/server.go): a critical XID marks its GPU unhealthy (allocatable drops, capacity
stays), the application XIDs it skips do not, nothing but a restart of the plugin makes the GPU
healthy again (fake node backend, no containers)."""

from __future__ import annotations

import time
from pathlib import Path

import yaml
from kubernetes import client

from gpuprov.lab.kube import deviceplugin
from gpuprov.lab.kube.backend import FakeBackend, FakeNode, Gpu
from gpuprov.lab.kube.testing import NVIDIA_CONTAINERD, fake_uuids, running_emulator, wait_for

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "kube"
GPU = "nvidia.com/gpu"


def test_disabled_xids_as_health_go_reads_them():
    assert deviceplugin.disabled_xids({}) == (False, frozenset({13, 31, 43, 45, 68, 109}),
                                              frozenset())
    assert not deviceplugin.xid_marks_unhealthy(13, {})
    assert deviceplugin.xid_marks_unhealthy(79, {})
    assert not deviceplugin.xid_marks_unhealthy(79, {"DP_DISABLE_HEALTHCHECKS": "79, 48"})
    assert not deviceplugin.xid_marks_unhealthy(79, {"DP_DISABLE_HEALTHCHECKS": "all"})
    assert deviceplugin.xid_marks_unhealthy(79, {"DP_DISABLE_HEALTHCHECKS": "xids",
                                                 "DP_ENABLE_HEALTHCHECKS": "79"})
    assert deviceplugin.xid_marks_unhealthy(13, {"DP_ENABLE_HEALTHCHECKS": "13"})
    assert deviceplugin.xid_marks_unhealthy(13, {"DP_ENABLE_HEALTHCHECKS": "all"})


def test_critical_xid_unhealthy_until_the_plugin_restarts():
    pascal = FakeNode([Gpu(u) for u in fake_uuids("gpu-pascal", 4)], NVIDIA_CONTAINERD)
    backend = FakeBackend({"gpu-pascal": pascal})
    with running_emulator(backend) as emu:
        cfg = client.Configuration()
        cfg.host = emu.url
        api = client.ApiClient(cfg)
        core = client.CoreV1Api(api)
        manifest = yaml.safe_load((FIXTURES / "nvidia-device-plugin.yml").read_text())
        client.AppsV1Api(api).create_namespaced_daemon_set("kube-system", manifest)

        def gpus() -> tuple[str, str]:
            status = core.read_node("gpu-pascal").status
            return (status.capacity or {}).get(GPU), (status.allocatable or {}).get(GPU)

        wait_for(lambda: gpus() == ("4", "4"), "4 GPUs allocatable")
        pascal.xids.append((5, 1, 13))  # an application XID: skipped
        time.sleep(1.0)
        assert gpus() == ("4", "4")
        pascal.xids.append((6, 1, 79))
        wait_for(lambda: gpus() == ("4", "3"), "GPU 1 unhealthy after XID 79")
        time.sleep(1.0)
        assert gpus() == ("4", "3")  # no way back on its own
        (pod,) = core.list_namespaced_pod("kube-system",
                                          field_selector="spec.nodeName=gpu-pascal").items
        core.delete_namespaced_pod(pod.metadata.name, "kube-system")
        wait_for(lambda: gpus() == ("4", "4"), "4 GPUs allocatable after the plugin restart")
