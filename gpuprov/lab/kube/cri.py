"""SIMULATION support: the lab's kubelet talks to a node's containerd through the CRI.

Test infrastructure. A real kubelet reaches its container runtime through the CRI, the
`runtime.v1` gRPC API on the runtime's socket; the lab's emulated kubelet does the same, from
the host, through the node container's root (/proc/<pid>/root/run/containerd/containerd.sock).
The Python stubs are generated with grpcio-tools from the CRI's own `api.proto` as Debian ships
it in `golang-k8s-cri-api-dev` (fetched by scripts/fetch-containerd.sh into the machine's cache,
gpuprov/lab/cache.py), once (protostubs.py): generated code is not kept in git.

Followed for the requests a kubelet sends: kubernetes pkg/kubelet/kuberuntime
(kuberuntime_sandbox.go `generatePodSandboxConfig`, kuberuntime_container.go
`generateContainerConfig`, the log path `<pod log dir>/<container>/<attempt>.log`) and the CRI
log format (`<RFC3339Nano> <stream> <P|F> <text>`, kubelet pkg/kubelet/kuberuntime/logs).
Not done: CNI (every pod sandbox uses the node's network, as hostNetwork pods do), image pulls
(the lab has no registry: images must be in the node already), exec/attach, resources.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpuprov.lab.cache import CONTAINERD
from gpuprov.lab.kube import protostubs

if TYPE_CHECKING:
    from gpuprov.lab.kube.backend import ContainerRequest

PROTO = (CONTAINERD / "cri-api/usr/share/gocode/src/k8s.io/cri-api/pkg/apis/runtime/v1"
         "/api.proto")
SOCKET = "run/containerd/containerd.sock"
CALL_TIMEOUT = 30.0
# The Version call is made from the controllers' thread: a runtime that hangs must not stop it.
VERSION_TIMEOUT = 5.0
# containerd's CRI states (api.proto ContainerState).
CONTAINER_RUNNING = 1
CONTAINER_EXITED = 2


def stubs() -> tuple:
    """(api_pb2, api_pb2_grpc), generated from api.proto on first use."""
    return protostubs.load(PROTO, "api_pb2", "api_pb2_grpc", grpc=True)


class CriError(RuntimeError):
    """A CRI call failed; `code` is the gRPC status name (NOT_FOUND, UNAVAILABLE, ...)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def log_directory(req: ContainerRequest) -> str:
    return f"/var/log/pods/{req.namespace}_{req.pod_name}_{req.pod_uid}"


def parse_log(raw: str) -> str:
    """A CRI log file's text -> what `kubectl logs` shows: each line is `<time> <stream>
    <P|F> <text>`; P (partial) lines join the next."""
    out: list[str] = []
    for line in raw.splitlines():
        parts = line.split(" ", 3)
        if len(parts) < 3:
            continue
        text = parts[3] if len(parts) == 4 else ""
        out.append(text if parts[2] == "P" else text + "\n")
    return "".join(out)


class Client:
    """One node's containerd, through its CRI socket at `root`/run/containerd/containerd.sock."""

    def __init__(self, root: str) -> None:
        import grpc

        self._grpc = grpc
        self.pb, pb_grpc = stubs()
        self._channel = grpc.insecure_channel(f"unix://{root}/{SOCKET}")
        self.runtime = pb_grpc.RuntimeServiceStub(self._channel)
        self.images = pb_grpc.ImageServiceStub(self._channel)

    def close(self) -> None:
        self._channel.close()

    def _call(self, method, request, timeout: float = CALL_TIMEOUT):  # noqa: ANN001
        try:
            return method(request, timeout=timeout)
        except self._grpc.RpcError as exc:
            raise CriError(exc.code().name, exc.details() or str(exc.code())) from None

    def version(self) -> tuple[str, str]:
        """(runtime name, runtime version) as the runtime answers the CRI Version call: a
        kubelet reports them as nodeInfo.containerRuntimeVersion `<name>://<version>`
        (kubernetes pkg/kubelet/nodestatus/setters.go VersionInfo)."""
        answer = self._call(self.runtime.Version, self.pb.VersionRequest(version="v1"),
                            VERSION_TIMEOUT)
        return answer.runtime_name, answer.runtime_version

    def image_present(self, image: str) -> bool:
        pb = self.pb
        answer = self._call(self.images.ImageStatus,
                            pb.ImageStatusRequest(image=pb.ImageSpec(image=image)))
        return bool(answer.image.id)

    def run_sandbox(self, req: ContainerRequest) -> str:
        """The pod's sandbox on the node's network (no CNI), as the kubelet asks for a
        hostNetwork pod (no hostname: a sandbox without its own UTS namespace has none)."""
        pb = self.pb
        node_ns = pb.NamespaceOption(network=pb.NODE, pid=pb.POD, ipc=pb.POD)
        config = pb.PodSandboxConfig(
            metadata=pb.PodSandboxMetadata(name=req.pod_name, uid=req.pod_uid,
                                           namespace=req.namespace),
            log_directory=log_directory(req),
            labels={"io.kubernetes.pod.name": req.pod_name,
                    "io.kubernetes.pod.namespace": req.namespace,
                    "io.kubernetes.pod.uid": req.pod_uid},
            linux=pb.LinuxPodSandboxConfig(security_context=pb.LinuxSandboxSecurityContext(
                namespace_options=node_ns, privileged=req.sandbox_privileged)))
        answer = self._call(self.runtime.RunPodSandbox,
                            pb.RunPodSandboxRequest(config=config, runtime_handler=req.handler))
        return answer.pod_sandbox_id

    def create_container(self, sandbox_id: str, req: ContainerRequest) -> str:
        pb = self.pb
        sandbox = pb.PodSandboxConfig(
            metadata=pb.PodSandboxMetadata(name=req.pod_name, uid=req.pod_uid,
                                           namespace=req.namespace),
            log_directory=log_directory(req))
        config = pb.ContainerConfig(
            metadata=pb.ContainerMetadata(name=req.name, attempt=req.attempt),
            image=pb.ImageSpec(image=req.image),
            command=list(req.argv),
            # KeyValue.value is `bytes` in api.proto.
            envs=[pb.KeyValue(key=k, value=v.encode()) for k, v in req.env.items()],
            mounts=[pb.Mount(container_path=m.destination, host_path=m.source, readonly=True)
                    for m in req.mounts],
            annotations=dict(req.annotations),
            CDI_devices=[pb.CDIDevice(name=name) for name in req.cdi_devices],
            log_path=f"{req.name}/{req.attempt}.log",
            labels={"io.kubernetes.container.name": req.name,
                    "io.kubernetes.pod.name": req.pod_name,
                    "io.kubernetes.pod.namespace": req.namespace,
                    "io.kubernetes.pod.uid": req.pod_uid},
            linux=pb.LinuxContainerConfig(security_context=pb.LinuxContainerSecurityContext(
                privileged=req.privileged,
                capabilities=pb.Capability(add_capabilities=list(req.add_capabilities),
                                           drop_capabilities=list(req.drop_capabilities)),
                namespace_options=pb.NamespaceOption(network=pb.NODE, pid=pb.CONTAINER))))
        answer = self._call(self.runtime.CreateContainer, pb.CreateContainerRequest(
            pod_sandbox_id=sandbox_id, config=config, sandbox_config=sandbox))
        return answer.container_id

    def start_container(self, container_id: str) -> None:
        self._call(self.runtime.StartContainer,
                   self.pb.StartContainerRequest(container_id=container_id))

    def container_status(self, container_id: str) -> tuple[int, int, str]:
        """(state, exit code, log path on the node) of a container."""
        answer = self._call(self.runtime.ContainerStatus,
                            self.pb.ContainerStatusRequest(container_id=container_id))
        status = answer.status
        return status.state, status.exit_code, status.log_path

    def stop_container(self, container_id: str, timeout: int) -> None:
        self._call(self.runtime.StopContainer,
                   self.pb.StopContainerRequest(container_id=container_id, timeout=timeout))

    def remove_container(self, container_id: str) -> None:
        self._call(self.runtime.RemoveContainer,
                   self.pb.RemoveContainerRequest(container_id=container_id))

    def stop_sandbox(self, sandbox_id: str) -> None:
        """Stop the sandbox: its containers are killed, and stay for their status and logs."""
        self._call(self.runtime.StopPodSandbox,
                   self.pb.StopPodSandboxRequest(pod_sandbox_id=sandbox_id))

    def remove_sandbox(self, sandbox_id: str) -> None:
        """Stop the sandbox and remove it with its containers."""
        self.stop_sandbox(sandbox_id)
        self._call(self.runtime.RemovePodSandbox,
                   self.pb.RemovePodSandboxRequest(pod_sandbox_id=sandbox_id))

    def list_sandboxes(self) -> list[tuple[str, str]]:
        """(sandbox ID, pod UID) of every sandbox the node's containerd has."""
        answer = self._call(self.runtime.ListPodSandbox, self.pb.ListPodSandboxRequest())
        return [(item.id, item.metadata.uid) for item in answer.items]
