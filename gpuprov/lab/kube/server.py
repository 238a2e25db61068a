"""The HTTP front of the emulated API server: routing, verbs, watch streams, Status bodies.

HTTP stack: the standard library's ThreadingHTTPServer, deliberately. The emulator serves a
handful of clients on loopback; one thread per connection is plenty, it adds no dependency to
the project, and BaseHTTPRequestHandler makes the one unusual need, a chunked watch stream
that stays open for minutes, a few lines of code. HTTP/1.1 keep-alive is on, as the
kubernetes client's urllib3 pool expects.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socketserver
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import yaml

from gpuprov.lab.kube import openapi, printers, resources, selectors
from gpuprov.lab.kube.errors import ApiError
from gpuprov.lab.kube.registry import PODS, Registry
from gpuprov.lab.kube.resources import ResourceType
from gpuprov.lab.kube.store import Store

log = logging.getLogger(__name__)

# A watch without timeoutSeconds ends after this long, as a real server ends it after a random
# 30-60 minutes; clients then re-watch from the last resourceVersion.
DEFAULT_WATCH_SECONDS = 1800

# Request bodies the emulator cannot decode: Kubernetes' protobuf and CBOR encodings.
UNREADABLE_BODIES = ("application/vnd.kubernetes.protobuf", "application/cbor",
                     "application/apply-patch+cbor")

# pods/log: (pod, container, query) -> (text so far, container still running?)
LogSource = Callable[[dict, str, dict], tuple[str, bool]]


def _no_logs(pod: dict, container: str, query: dict) -> tuple[str, bool]:
    return "", False


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    api: ApiServer


class _NodeServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    """A listener on a Unix socket that stands for one node's kubelet credentials: every
    request on it is that node's, and NodeRestriction applies (see _node_restriction)."""

    daemon_threads = True
    api: ApiServer
    node_identity: str
    path: str  # where the socket is (server_address is the descriptor path it was bound by)


class ApiServer:
    def __init__(self, registry: Registry, host: str = "127.0.0.1", port: int = 0,
                 logs: LogSource = _no_logs) -> None:
        self.registry = registry
        self.logs = logs
        self._httpd = _Server((host, port), _Handler)
        self._httpd.api = self
        self._httpd.node_identity = None  # type: ignore[attr-defined]
        self._thread: threading.Thread | None = None
        self._node_servers: list[_NodeServer] = []
        self.requests = 0  # served so far: benchmarks count API requests with it

    def serve_node_socket(self, path: str, node: str) -> None:
        """SIMULATION: serve node `node`'s kubelet credentials on a Unix socket. The lab's
        nodes reach the API through it (lab.py mounts its directory into the node, where
        systemd-socket-proxyd forwards the node's 127.0.0.1:6443 to it): no traffic to
        container bridge addresses, and the socket a request came in on is its identity,
        as a real API server takes it from the kubelet's client certificate."""
        if os.path.exists(path):
            os.unlink(path)  # left by an API server that was killed
        # A socket's address is at most 107 bytes, and a lab under pytest's temporary
        # directory is deeper than that: bind through the directory's descriptor
        # (/proc/self/fd/N/NAME, a short path to the same directory).
        directory, name = os.path.split(path)
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            server = _NodeServer(f"/proc/self/fd/{fd}/{name}", _Handler)
        finally:
            os.close(fd)
        server.api, server.node_identity, server.path = self, node, path
        os.chmod(path, 0o666)  # connect() needs write permission on the socket
        self._node_servers.append(server)
        threading.Thread(target=server.serve_forever, name=f"kube-api-{node}",
                         daemon=True).start()

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> str:
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="kube-api",
                                        daemon=True)
        self._thread.start()
        return self.url

    def serve_forever(self) -> None:
        self._httpd.serve_forever()

    def stop(self) -> None:
        self.registry.store.close()
        self._httpd.shutdown()
        self._httpd.server_close()
        for server in self._node_servers:
            server.shutdown()
            server.server_close()
            with contextlib.suppress(OSError):
                os.unlink(server.path)



class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    # -- plumbing ------------------------------------------------------------------------------
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (stdlib signature)
        log.debug("%s %s", self.address_string(), format % args)

    def address_string(self) -> str:
        node = getattr(self.server, "node_identity", None)
        return f"node {node}" if node else super().address_string()

    def do_GET(self) -> None:  # noqa: N802 (stdlib naming)
        self._dispatch("GET")

    def do_POST(self) -> None:  # noqa: N802
        self._dispatch("POST")

    def do_PUT(self) -> None:  # noqa: N802
        self._dispatch("PUT")

    def do_PATCH(self) -> None:  # noqa: N802
        self._dispatch("PATCH")

    def do_DELETE(self) -> None:  # noqa: N802
        self._dispatch("DELETE")

    def _send_json(self, code: int, doc: Any) -> None:
        self._send_bytes(code, json.dumps(doc, separators=(",", ":")).encode(),
                         "application/json")

    def _send_bytes(self, code: int, data: bytes, content_type: str,
                    headers: dict[str, str] | None = None) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(data)

    def _send_text(self, code: int, text: str) -> None:
        data = text.encode()
        self.send_response(code)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _start_chunked(self, content_type: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def _chunk(self, data: bytes) -> None:
        if data:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

    def _end_chunked(self) -> None:
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _body(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        if not length:
            return None
        raw = self.rfile.read(length)
        ctype = self.headers.get("Content-Type", "")
        if ctype.split(";")[0].strip() in UNREADABLE_BODIES:
            # client-go's typed clients send built-in kinds as protobuf (kubectl create
            # namespace|configmap|secret...); a real server reads it, the emulator does not:
            # the 415 a real server gives a body it cannot read
            # (apimachinery runtime.NewUnsupportedMediaTypeError), one clear line.
            raise ApiError(415, "UnsupportedMediaType",
                           "the body of the request was in an unknown format - accepted media "
                           "types include: application/json, application/yaml (the lab's "
                           "emulated API server reads no protobuf or CBOR)")
        try:
            if "yaml" in ctype:
                return yaml.safe_load(raw)
            return json.loads(raw)
        except (ValueError, yaml.YAMLError) as err:
            raise ApiError.bad_request(f"could not decode the request body: {err}") from err

    # -- dispatch ------------------------------------------------------------------------------
    def _dispatch(self, method: str) -> None:
        api = self.server.api
        api.requests += 1
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
        try:
            body = self._body() if method in ("POST", "PUT", "PATCH", "DELETE") else None
            self._handle(method, url.path, query, body)
        except ApiError as err:
            self._send_json(err.code, err.status())
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except Exception as err:  # a bug in the emulator: say so like a real server would
            log.exception("internal error on %s %s", method, self.path)
            self._send_json(500, ApiError(500, "InternalError", f"emulator error: {err}")
                            .status())

    def _handle(self, method: str, path: str, query: dict, body: Any) -> None:
        parts = [p for p in path.split("/") if p]
        if method == "GET" and parts[:1] == ["openapi"]:
            self._openapi(parts[1:], query)
            return
        if method == "GET" and self._serve_discovery(parts):
            return
        rt, namespace, name, sub = self._resolve(*_api_path(parts))
        if sub and rt.subresource(sub) is None:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        node = getattr(self.server, "node_identity", None)
        if node:
            self._node_restriction(node, method, rt, namespace or "", name, sub, query, body)
        if method == "GET":
            self._get(rt, namespace, name, sub, query)
        elif method == "POST":
            self._post(rt, namespace or "", name, sub, query, body)
        elif method in ("PUT", "PATCH") and name:
            self._update(method, rt, namespace or "", name, sub, query, body)
        elif method == "DELETE" and not sub:
            self._delete(rt, namespace, name, query, body)
        else:
            raise ApiError.method_not_allowed()

    def _node_restriction(self, node: str, method: str, rt: ResourceType, namespace: str,
                          name: str, sub: str, query: dict, body: Any) -> None:
        """What a kubelet's credentials may do, as the Node authorizer and the NodeRestriction
        admission plugin decide it, for the calls the lab's nodes make (the health agent's):
        read; write its own Node and node status, but not the Node's taints; create Events.
        Followed: kubernetes plugin/pkg/admission/noderestriction/admission.go (admitNode,
        its messages) and plugin/pkg/auth/authorizer/node. Not emulated: the Node
        authorizer's graph (which secrets, configmaps and pods a node may read), leases,
        CSINodes, ResourceSlices, pods and their status."""
        user = f"system:node:{node}"
        if method == "GET":
            return
        if rt.plural == "events" and method == "POST":
            return
        if rt.plural != "nodes" or not name or method not in ("PATCH", "PUT"):
            verb = {"POST": "create", "PUT": "update", "PATCH": "patch",
                    "DELETE": "delete"}.get(method, method.lower())
            resource = f"{rt.plural}/{sub}" if sub else rt.plural
            raise ApiError.forbidden(rt.group, rt.plural, name, (
                f'User "{user}" cannot {verb} resource "{resource}" in API group '
                f'"{rt.group}"' + (f' in the namespace "{namespace}"' if namespace else
                                   " at the cluster scope")))
        if name != node:
            raise ApiError.forbidden(rt.group, rt.plural, name,
                                     f"node {node!r} is not allowed to modify node {name!r}"
                                     .replace("'", '"'))
        reg = self.server.api.registry
        before = reg.get(rt, namespace, name)
        if method == "PUT":
            after = reg.replace(rt, namespace, name, body, sub, True)
        else:
            ctype = self.headers.get("Content-Type", "application/merge-patch+json")
            after = reg.patch(rt, namespace, name, ctype, body, sub, True)
        if (before.get("spec") or {}).get("taints") != (after.get("spec") or {}).get("taints"):
            raise ApiError.forbidden(rt.group, rt.plural, name,
                                     f'node "{node}" is not allowed to modify taints')

    def _serve_discovery(self, parts: list[str]) -> bool:
        doc = self._discovery(parts)
        if doc is None:
            return False
        if isinstance(doc, str):
            self._send_text(200, doc)
        else:
            self._send_json(200, doc)
        return True

    # -- verbs ---------------------------------------------------------------------------------
    def _get(self, rt: ResourceType, namespace: str | None, name: str, sub: str,
             query: dict) -> None:
        if query.get("watch") in ("true", "1"):
            self._watch(rt, namespace, name, query)
        elif sub == "log":
            self._log(namespace or "", name, query)
        elif name:
            obj = self.server.api.registry.get(rt, namespace or "", name)
            if not self._send_table(rt, [obj], obj["metadata"]["resourceVersion"], query):
                self._send_json(200, obj)
        else:
            self._list(rt, namespace, query)

    # -- server-side printing and OpenAPI ------------------------------------------------------
    def _table_version(self, rt: ResourceType) -> str | None:
        """The meta.k8s.io Table version the client accepts first, when it prefers a Table
        and the kind has a printer (printers.py); None: answer the object or list itself.
        Accept clauses are taken in the client's order, as kubectl lists them
        (`...;as=Table;v=v1;g=meta.k8s.io, ...;as=Table;v=v1beta1;g=meta.k8s.io,
        application/json`)."""
        for clause in self.headers.get("Accept", "").split(","):
            media, *params = (p.strip() for p in clause.split(";"))
            options = dict(p.partition("=")[::2] for p in params)
            if options.get("as") == "Table":
                if (options.get("g") == "meta.k8s.io" and options.get("v") in ("v1", "v1beta1")
                        and printers.has_printer(rt)):
                    return options["v"]
                continue
            if media in ("application/json", "application/*", "*/*", ""):
                return None
        return None

    def _send_table(self, rt: ResourceType, items: list[dict], rv: str, query: dict) -> bool:
        version = self._table_version(rt)
        if version is None:
            return False
        include = query.get("includeObject", "")
        if include not in ("", "Object", "Metadata", "None"):
            raise ApiError.bad_request(f'unrecognized includeObject value: "{include}"')
        self._send_json(200, printers.table(rt, items, rv, include, version,
                                            query.get("noHeaders") == "true"))
        return True

    def _openapi(self, parts: list[str], query: dict) -> None:
        """/openapi/v2 (JSON or protobuf, by Accept), /openapi/v3 (discovery) and
        /openapi/v3/<group-version>, as kube-openapi's handlers serve them (pkg/handler,
        pkg/handler3): ETags of the content, and a v3 document asked for with an old `hash`
        redirected to the current one."""
        if parts == ["v2"]:
            if any(t in self.headers.get("Accept", "") for t in openapi.V2_PROTOBUF_ACCEPT):
                data, ctype = openapi.v2_protobuf(), openapi.V2_PROTOBUF_TYPE
            else:
                data, ctype = openapi.document_bytes("v2") or b"", "application/json"
            self._send_bytes(200, data, ctype, {"ETag": f'"{openapi.etag(data)}"',
                                                "Vary": "Accept"})
            return
        if parts == ["v3"]:
            self._send_json(200, openapi.v3_discovery())
            return
        name = "/".join(parts[1:])
        data = openapi.document_bytes(name) if parts[:1] == ["v3"] and name != "v2" else None
        if data is None:
            _not_found()
        tag = openapi.etag(data)
        headers = {"ETag": f'"{tag}"', "Vary": "Accept"}
        wanted = query.get("hash")
        if wanted and wanted != tag:
            self._send_bytes(301, b"", "text/plain",
                             {"Location": f"/openapi/v3/{name}?hash={tag}"})
            return
        if wanted:
            headers["Cache-Control"] = "public, immutable"
        self._send_bytes(200, data, "application/json", headers)

    def _post(self, rt: ResourceType, namespace: str, name: str, sub: str, query: dict,
              body: Any) -> None:
        reg = self.server.api.registry
        if sub == "eviction":
            self._send_json(201, reg.evict(namespace, name, body))
        elif sub == "binding":
            self._send_json(201, reg.bind(namespace, name, body))
        elif name or sub:
            raise ApiError.method_not_allowed()
        else:
            self._send_json(201, reg.create(rt, namespace, body, _dry_run(query)))

    def _update(self, method: str, rt: ResourceType, namespace: str, name: str, sub: str,
                query: dict, body: Any) -> None:
        reg = self.server.api.registry
        if method == "PUT":
            self._send_json(200, reg.replace(rt, namespace, name, body, sub, _dry_run(query)))
        else:
            ctype = self.headers.get("Content-Type", "application/merge-patch+json")
            self._send_json(200, reg.patch(rt, namespace, name, ctype, body, sub,
                                           _dry_run(query)))

    def _delete(self, rt: ResourceType, namespace: str | None, name: str, query: dict,
                body: Any) -> None:
        reg = self.server.api.registry
        options = {**(body or {}), **_delete_query(query)}
        if name:
            self._send_json(200, reg.delete(rt, namespace or "", name, options,
                                            _dry_run(query)))
            return
        reg.delete_collection(rt, namespace, query.get("labelSelector"),
                              query.get("fieldSelector"), options, _dry_run(query))
        self._send_json(200, {"kind": "Status", "apiVersion": "v1", "metadata": {},
                              "status": "Success"})

    def _discovery(self, parts: list[str]) -> dict | str | None:
        if parts in (["healthz"], ["livez"], ["readyz"]):
            return "ok"
        if parts == ["version"]:
            return resources.version_doc()
        if parts == ["api"]:
            host, port = self.server.server_address[:2]
            return resources.core_versions_doc(f"{host}:{port}")
        if parts == ["apis"]:
            return resources.group_list_doc()
        if len(parts) == 2 and parts[0] == "apis":
            return resources.group_doc(parts[1]) or _not_found()
        if len(parts) == 2 and parts[0] == "api":
            return resources.resource_list_doc("", parts[1]) or _not_found()
        if len(parts) == 3 and parts[0] == "apis":
            return resources.resource_list_doc(parts[1], parts[2]) or _not_found()
        return None

    @staticmethod
    def _resolve(group: str, version: str,
                 rest: list[str]) -> tuple[ResourceType, str | None, str, str]:
        namespace = None
        if len(rest) >= 3 and rest[0] == "namespaces":
            rt = resources.find(group, version, rest[2])
            if rt is not None and rt.namespaced:
                namespace, rest = rest[1], rest[2:]
        if not rest or len(rest) > 3:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        rt = resources.find(group, version, rest[0])
        if rt is None:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        name = rest[1] if len(rest) > 1 else ""
        sub = rest[2] if len(rest) > 2 else ""
        if rt.namespaced and namespace is None and name:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        return rt, namespace, name, sub

    # -- list and watch --------------------------------------------------------------------------
    def _list(self, rt: ResourceType, namespace: str | None, query: dict) -> None:
        items, rv = self.server.api.registry.list(rt, namespace, query.get("labelSelector"),
                                                  query.get("fieldSelector"))
        items = sorted(items, key=lambda o: (o["metadata"].get("namespace", ""),
                                             o["metadata"]["name"]))
        if self._send_table(rt, items, str(rv), query):
            return
        self._send_json(200, {"kind": f"{rt.kind}List", "apiVersion": rt.api_version,
                              "metadata": {"resourceVersion": str(rv)}, "items": items})

    def _watch(self, rt: ResourceType, namespace: str | None, name: str, query: dict) -> None:
        store = self.server.api.registry.store
        visible = _watch_filter(rt, namespace, name, query)
        timeout = float(query.get("timeoutSeconds") or DEFAULT_WATCH_SECONDS)
        deadline = time.monotonic() + timeout
        initial = _send_initial_events(query)
        cursor, lines = _watch_start(store, rt, namespace, visible,
                                     query.get("resourceVersion") or "", initial)
        if initial:
            lines.append(_initial_events_end(rt, cursor))
        self._start_chunked("application/json")
        while True:
            for line in lines:
                self._chunk(json.dumps(line, separators=(",", ":")).encode() + b"\n")
            lines = []
            remaining = deadline - time.monotonic()
            if remaining <= 0 or store.closed:
                break
            store.wait(cursor, min(remaining, 5.0))
            cursor, lines = _watch_events(store, rt, cursor, visible)
            if lines and lines[-1]["type"] == "ERROR":
                for line in lines:
                    self._chunk(json.dumps(line).encode() + b"\n")
                break
        self._end_chunked()

    # -- pods/log ----------------------------------------------------------------------------------
    def _log(self, namespace: str, name: str, query: dict) -> None:
        reg = self.server.api.registry
        pod = reg.get(PODS, namespace, name)
        names = [c["name"] for c in pod["spec"].get("containers", [])]
        names += [c["name"] for c in pod["spec"].get("initContainers") or []]
        container = query.get("container") or ""
        if not container:
            if len(pod["spec"]["containers"]) != 1:
                raise ApiError.bad_request(
                    f"a container name must be specified for pod {name}, choose one of: "
                    f"[{' '.join(names)}]")
            container = names[0]
        if container not in names:
            raise ApiError.bad_request(f"container {container} is not valid for pod {name}")
        source = self.server.api.logs
        text, running = source(pod, container, query)
        if not text and not running and not _container_started(pod, container):
            raise ApiError.bad_request(
                f'container "{container}" in pod "{name}" is waiting to start: '
                "ContainerCreating")
        if query.get("follow") not in ("true", "1") or not running:
            self._send_text(200, text)
            return
        self._start_chunked("text/plain")
        self._chunk(text.encode())
        sent = len(text)
        while running and not reg.store.closed:
            time.sleep(0.1)
            current = reg.find(PODS, namespace, name)
            if current is None:
                break
            text, running = source(current, container, {})
            self._chunk(text[sent:].encode())
            sent = len(text)
        self._end_chunked()


def _api_path(parts: list[str]) -> tuple[str, str, list[str]]:
    """(group, version, the rest) of an /api/<version>/... or /apis/<group>/<version>/...
    path."""
    if len(parts) >= 2 and parts[0] == "api":
        return "", parts[1], parts[2:]
    if len(parts) >= 3 and parts[0] == "apis":
        return parts[1], parts[2], parts[3:]
    raise ApiError(404, "NotFound", "the server could not find the requested resource")


def _dry_run(query: dict) -> bool:
    return query.get("dryRun") == "All"


def _watch_filter(rt: ResourceType, namespace: str | None, name: str,
                  query: dict) -> Callable[[dict | None], bool]:
    """Whether an object (or None) is in the watch's selection."""
    field_sel = query.get("fieldSelector")
    if name:
        field_sel = ",".join(filter(None, [field_sel, f"metadata.name={name}"]))
    accept = selectors.object_filter(query.get("labelSelector"), field_sel,
                                     rt.selectable_fields)

    def visible(obj: dict | None) -> bool:
        if obj is None:
            return False
        if namespace is not None and obj["metadata"].get("namespace") != namespace:
            return False
        return accept(obj)

    return visible


def _send_initial_events(query: dict) -> bool:
    """A watch-list request (KEP-3157 "streaming lists", which client-go 1.36 informers and
    `kubectl wait` use): the current objects as ADDED events, then a BOOKMARK that marks their
    end, then the changes. The query is checked as apimachinery's validateWatchOptions does
    (pkg/apis/meta/internalversion/validation/validation.go)."""
    sending = query.get("sendInitialEvents")
    match = query.get("resourceVersionMatch")
    if sending is None:
        if match:
            raise ApiError.invalid("", "ListOptions", "", [(
                "FieldValueForbidden", "resourceVersionMatch", "Forbidden: resourceVersionMatch "
                "is forbidden for watch unless sendInitialEvents is provided")])
        return False
    if match != "NotOlderThan":
        raise ApiError.invalid("", "ListOptions", "", [(
            "FieldValueForbidden", "resourceVersionMatch", "Forbidden: sendInitialEvents "
            "requires setting resourceVersionMatch to NotOlderThan")])
    return sending in ("true", "1")


def _initial_events_end(rt: ResourceType, cursor: int) -> dict:
    """The BOOKMARK that ends a watch-list's initial events: an object of the kind with only
    its resourceVersion and the k8s.io/initial-events-end annotation
    (apimachinery pkg/apis/meta/v1/types.go InitialEventsAnnotationKey)."""
    return {"type": "BOOKMARK", "object": {
        "kind": rt.kind, "apiVersion": rt.api_version,
        "metadata": {"resourceVersion": str(cursor),
                     "annotations": {"k8s.io/initial-events-end": "true"}}}}


def _watch_start(store: Store, rt: ResourceType, namespace: str | None,
                 visible: Callable[[dict | None], bool], since: str,
                 initial: bool = False) -> tuple[int, list[dict]]:
    """Where a watch starts (a resourceVersion) and its first lines: without a version (or
    with "0"), or with sendInitialEvents (`initial`: the state now, which is not older than any
    version asked for), an ADDED event for every object in the selection now."""
    lines: list[dict] = []
    with store.lock:
        if since in ("", "0") or initial:
            cursor = store.resource_version
            for obj in store.list(rt, namespace, visible)[0]:
                lines.append({"type": "ADDED", "object": obj})
        else:
            if not since.isdigit():
                raise ApiError.bad_request(f"invalid resourceVersion {since!r}")
            cursor = int(since)
    return cursor, lines


def _watch_events(store: Store, rt: ResourceType, cursor: int,
                  visible: Callable[[dict | None], bool]) -> tuple[int, list[dict]]:
    """The watch's lines for the changes after cursor, and the new cursor; a lone ERROR line
    when those changes are compacted away (410)."""
    with store.lock:
        try:
            events = list(store.events_after(cursor))
        except ApiError as err:
            return cursor, [{"type": "ERROR", "object": err.status()}]
    lines = []
    for ev in events:
        cursor = ev.rv
        if ev.rtype != rt.key:
            continue
        kind = _watch_event_type(ev.type, visible(ev.obj), visible(ev.old))
        if kind:
            lines.append({"type": kind, "object": ev.obj})
    return cursor, lines


def _watch_event_type(change: str, now_in: bool, was_in: bool) -> str | None:
    """What a change is to a watcher of a selection: an object entering it is ADDED, one
    leaving it DELETED, one changing within it MODIFIED."""
    if change == "DELETED":
        return "DELETED" if was_in else None
    if now_in and was_in:
        return "MODIFIED"
    if now_in:
        return "ADDED"
    if was_in:
        return "DELETED"
    return None


def _container_started(pod: dict, container: str) -> bool:
    status = pod.get("status") or {}
    for cs in (status.get("containerStatuses") or []) + (status.get("initContainerStatuses")
                                                         or []):
        if cs.get("name") == container:
            return "waiting" not in (cs.get("state") or {"waiting": {}})
    return False


def _delete_query(query: dict) -> dict:
    out: dict[str, Any] = {}
    if "gracePeriodSeconds" in query:
        out["gracePeriodSeconds"] = int(query["gracePeriodSeconds"])
    if "propagationPolicy" in query:
        out["propagationPolicy"] = query["propagationPolicy"]
    if "orphanDependents" in query:
        out["orphanDependents"] = query["orphanDependents"] == "true"
    return out


def _not_found() -> dict:
    raise ApiError(404, "NotFound", "the server could not find the requested resource")

