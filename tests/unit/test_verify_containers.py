"""verify's container and swarm checks (gpuprov/verify/checks/containers.py, swarm.py) on what
the smoke containers and the swarm's manager answered (records as gpuprov.verify.containers
and gpuprov.verify.swarm make them; the lab runs them against real engines:
tests/lab/test_docker_lab.py)."""

from __future__ import annotations

from gpuprov.verify.checks import containers as cc
from gpuprov.verify.checks import swarm as sc
from gpuprov.verify.containers import ContainerRecord, ContainerRun
from gpuprov.verify.facts import ContainerFacts, SwarmFacts
from gpuprov.verify.findings import CHECKS
from gpuprov.verify.inventory import Node
from gpuprov.verify.swarm import ServiceRecord, SwarmView

GPUS = ["GPU-a", "GPU-b"]
REPORT = {"nvml": {"gpus": [{"index": 0, "uuid": "GPU-a"}, {"index": 1, "uuid": "GPU-b"}]}}
HOST = Node("docker-12", None, False, docker=True)
SWARM_HOST = Node("docker-12", None, False, docker=True, swarm=True)


def _facts(records: dict, default_runtime: str = "runc", node: Node = HOST) -> ContainerFacts:
    return ContainerFacts(node, REPORT, ContainerRun("docker-12", "20.10.24", default_runtime,
                                                     False, records))


def test_all_gpus_by_uuid_pass_and_one_missing_fails():
    ok = ContainerRecord("c1", "--gpus 2", tuple(GPUS), 0)
    assert cc.gpu_count(_facts({"gpu-count": (ok,)})).status == "pass"
    short = ContainerRecord("c1", "--gpus 2", ("GPU-a",), 0)
    verdict = cc.gpu_count(_facts({"gpu-count": (ok, short)}))
    assert verdict.status == "problem" and "saw 1 GPU(s)" in verdict.message


def test_what_the_engine_refused_is_in_the_message():
    refused = ContainerRecord("c1", "--device nvidia.com/gpu=GPU-a", error="could not select "
                              "device driver \"cdi\" with capabilities: []")
    verdict = cc.gpu_count(_facts({"gpu-count": (refused,)}))
    assert verdict.status == "problem"
    assert "the engine answered: could not select" in verdict.message


def test_isolation_wants_each_container_its_own_gpu():
    good = (ContainerRecord("i0", "--gpus device=0", ("GPU-a",)),
            ContainerRecord("i1", "--gpus device=1", ("GPU-b",)))
    assert cc.isolation(_facts({"isolation": good})).status == "pass"
    leaked = (good[0], ContainerRecord("i1", "--gpus device=1", ("GPU-a", "GPU-b")))
    assert cc.isolation(_facts({"isolation": leaked})).status == "problem"


def test_no_request_names_the_default_runtime_and_the_toolkit_key():
    saw = ContainerRecord("n", "-e NVIDIA_VISIBLE_DEVICES=all", tuple(GPUS), 0)
    verdict = cc.no_request(_facts({"no-request": (saw,)}, "nvidia"))
    assert verdict.status == "problem"
    assert "'nvidia'" in verdict.message
    assert "accept-nvidia-visible-devices-envvar-when-unprivileged" in verdict.message
    assert "nvidia_container_toolkit_docker_default_runtime: false" in \
        CHECKS["containers.no-request"].remediation
    none = ContainerRecord("n", "-e NVIDIA_VISIBLE_DEVICES=all", (), 0)
    assert cc.no_request(_facts({"no-request": (none,)})).status == "pass"


def test_on_a_swarm_gpu_node_the_leak_is_a_warning_not_hidden():
    saw = ContainerRecord("n", "-e NVIDIA_VISIBLE_DEVICES=all", tuple(GPUS), 0)
    facts = _facts({"no-request": (saw,)}, "nvidia", SWARM_HOST)
    assert cc.no_request(facts).status == "skip"
    verdict = sc.no_request(SwarmFacts(SWARM_HOST, REPORT, None, None, facts.run))
    assert verdict.status == "problem"
    assert CHECKS["swarm.no-request"].finding("docker-12", verdict).status == "warn"


def _view(resources, services=None) -> SwarmView:
    return SwarmView(manager="docker-12", nodes={"n1": {"resources": resources}},
                     node_ids={"docker-12": "n1"}, services=services or {},
                     series_nodes={"p100": ("n1",)},
                     placed={"p100": ServiceRecord("p", "NVIDIA-GPU=1", "n1", "complete",
                                                   ("GPU-b",), ("GPU-b",))})


def test_generic_resources_must_be_exactly_the_healthy_gpus():
    exact = [("NVIDIA-GPU", "GPU-a"), ("NVIDIA-GPU", "GPU-b"), ("fpga", "x")]
    assert sc.generic_resources(SwarmFacts(SWARM_HOST, REPORT, _view(exact))).status == "pass"
    ghost = [*exact, ("NVIDIA-GPU", "GPU-gone")]
    verdict = sc.generic_resources(SwarmFacts(SWARM_HOST, REPORT, _view(ghost)))
    assert verdict.status == "problem" and "advertises 1 GPU(s) it does not have" in \
        verdict.message and "GPU-gone" in verdict.message
    lost = {"nvml": {"gpus": [{"index": 0, "uuid": "GPU-a"},
                              {"index": 1, "uuid": "GPU-b", "error": "GPU is lost"}]}}
    verdict = sc.generic_resources(SwarmFacts(SWARM_HOST, lost, _view(exact)))
    assert verdict.status == "problem" and "GPU-b" in verdict.message


def test_the_service_must_see_exactly_what_swarm_assigned():
    ok = ServiceRecord("s", "NVIDIA-GPU=1", "n1", "complete", ("GPU-a",), ("GPU-a",))
    assert sc.service(SwarmFacts(SWARM_HOST, REPORT, _view([], {"docker-12": ok}))).status \
        == "pass"
    # NVIDIA's default swarm-resource (DOCKER_RESOURCE_GPU) with the kind NVIDIA-GPU: the task
    # sees every GPU instead of the one assigned.
    wrong = ServiceRecord("s", "NVIDIA-GPU=1", "n1", "complete", ("GPU-a",), tuple(GPUS))
    verdict = sc.service(SwarmFacts(SWARM_HOST, REPORT, _view([], {"docker-12": wrong})))
    assert verdict.status == "problem" and "Swarm assigned GPU-a" in verdict.message
