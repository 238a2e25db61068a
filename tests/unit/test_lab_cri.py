"""The lab kubelet's CRI client (gpuprov/lab/kube/cri.py): stubs generated from the CRI's own
api.proto (Debian's golang-k8s-cri-api-dev, fetched by `make containerd-bins`) and the CRI
log format, read from a log file containerd wrote."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuprov.lab.kube import cri

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "cri"


def test_a_real_containerd_log_reads_as_kubectl_logs_shows_it():
    raw = (FIXTURES / "containerd-1.6.20.log").read_text()
    # containerd split the long line at 16 KiB (P, then F); the last line has no newline.
    assert " stdout P " in raw and raw.count("\n") == 5
    assert cri.parse_log(raw) == ("out line\n" + "x" * 20000 + "\n" + "err line\n"
                                  + "no newline at end")


def test_log_lines_that_are_not_cri_records_are_skipped():
    assert cri.parse_log("garbage\n2026-11-25T11:58:24Z stdout F ok\n") == "ok\n"
    assert cri.parse_log("2026-11-25T11:58:24Z stdout F\n") == "\n"  # an empty line


def test_stubs_come_from_the_cri_api_proto():
    if not cri.PROTO.is_file():
        pytest.fail(f"{cri.PROTO} is missing: run `make containerd-bins`")
    pb, pb_grpc = cri.stubs()
    assert hasattr(pb_grpc.RuntimeServiceStub, "__init__")
    assert {"RunPodSandbox", "CreateContainer", "StartContainer", "ContainerStatus",
            "StopPodSandbox", "RemovePodSandbox", "ListPodSandbox"} <= set(
        pb.DESCRIPTOR.services_by_name["RuntimeService"].methods_by_name)
    # api.proto's KeyValue.value is bytes: a str is refused, as found on the lab.
    with pytest.raises(TypeError):
        pb.KeyValue(key="A", value="b")
    assert pb.KeyValue(key="A", value=b"b").value == b"b"
