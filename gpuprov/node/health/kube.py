"""The health agent's few Kubernetes API calls, with the kubelet's own credentials.

Standard library only (the node has python3 and nothing else): urllib over TLS with the
kubelet's client certificate (or a bearer token), the access the gpu_health role extracted
from the kubelet's kubeconfig into the agent's config (gpuprov/stages/gpu_health.py
kube_access). Under NodeRestriction a kubelet identity may read and patch its own Node and
its status, and nothing else (kubernetes plugin/pkg/admission/noderestriction/admission.go):
the agent needs nothing more.

Calls: GET the node (the admin's ack annotation); PATCH nodes/NAME/status with a strategic
merge patch of the conditions it owns (merge key "type"), or "$patch: delete" items to take
them away (on uninstall); PATCH nodes/NAME with a merge patch of its one annotation, the full
list of its faults. It never writes a condition or annotation outside gpuprov.io/.
"""

from __future__ import annotations

import json
import ssl
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from typing import Any

from .state import PREFIX

TIMEOUT_S = 10.0


class KubeError(Exception):
    pass


class Client:
    def __init__(self, access: Mapping[str, Any], node: str, timeout: float = TIMEOUT_S):
        """access: {"server", "ca_file" | "ca_data", "cert_file", "key_file" (or the same
        *_data, PEM text), "token_file" | "token", "insecure_skip_tls_verify"}."""
        self.server = str(access["server"]).rstrip("/")
        self.node = node
        self.timeout = timeout
        self._token = access.get("token")
        self._token_file = access.get("token_file")
        self._context: ssl.SSLContext | None = None
        if self.server.startswith("https:"):
            context = ssl.create_default_context()
            if access.get("insecure_skip_tls_verify"):
                context.check_hostname = False
                context.verify_mode = ssl.CERT_NONE
            if access.get("ca_file"):
                context.load_verify_locations(cafile=access["ca_file"])
            elif access.get("ca_data"):
                context.load_verify_locations(cadata=access["ca_data"])
            cert, key = access.get("cert_file"), access.get("key_file")
            if access.get("cert_data"):
                # ssl loads client certificates from files only: a private temporary file,
                # read at once and removed.
                with tempfile.NamedTemporaryFile("w", suffix=".pem") as pem:
                    pem.write(access["cert_data"] + "\n" + (access.get("key_data") or ""))
                    pem.flush()
                    context.load_cert_chain(pem.name)
            elif cert:
                context.load_cert_chain(cert, key or cert)
            self._context = context

    def _request(self, method: str, path: str, body: Any = None,
                 content_type: str = "application/json") -> Any:
        headers = {"Accept": "application/json", "User-Agent": "gpuprov-health-agent"}
        token = self._token
        if self._token_file:
            with open(self._token_file) as f:  # re-read: projected tokens rotate
                token = f.read().strip()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = content_type
        request = urllib.request.Request(self.server + path, data, headers, method=method)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout,
                                        context=self._context) as response:
                return json.loads(response.read() or b"null")
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode("utf-8", "replace")[:300]
            raise KubeError(f"{method} {path}: HTTP {exc.code}: {detail}") from None
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise KubeError(f"{method} {path}: {exc}") from None

    def _path(self, status: bool = False) -> str:
        return (f"/api/v1/nodes/{urllib.parse.quote(self.node)}"
                + ("/status" if status else ""))

    def get_node(self) -> dict:
        return self._request("GET", self._path())

    def patch_conditions(self, conditions: list[dict]) -> dict:
        """Set the given gpuprov.io/ conditions (a strategic merge keyed by type)."""
        for condition in conditions:
            if not str(condition.get("type", "")).startswith(PREFIX):
                raise ValueError(f"the agent writes {PREFIX} conditions only, not "
                                 f"{condition.get('type')!r}")
        return self._request("PATCH", self._path(status=True),
                             {"status": {"conditions": conditions}},
                             "application/strategic-merge-patch+json")

    def delete_conditions(self, types: list[str]) -> dict:
        for ctype in types:
            if not ctype.startswith(PREFIX):
                raise ValueError(f"the agent removes {PREFIX} conditions only, not {ctype!r}")
        return self._request("PATCH", self._path(status=True),
                             {"status": {"conditions": [{"type": t, "$patch": "delete"}
                                                        for t in types]}},
                             "application/strategic-merge-patch+json")

    def patch_annotation(self, name: str, value: str | None) -> dict:
        """Set (or, with None, remove) one gpuprov.io/ annotation of its own Node (a JSON merge
        patch of metadata: NodeRestriction lets a kubelet change its own Node object)."""
        if not name.startswith(PREFIX):
            raise ValueError(f"the agent writes {PREFIX} annotations only, not {name!r}")
        return self._request("PATCH", self._path(),
                             {"metadata": {"annotations": {name: value}}},
                             "application/merge-patch+json")
