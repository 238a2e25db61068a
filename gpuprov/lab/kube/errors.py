"""API errors carrying the `Status` body a real API server returns for them."""

from __future__ import annotations


class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str, details: dict | None = None):
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details

    def status(self) -> dict:
        body = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": self.message, "reason": self.reason, "code": self.code}
        if self.details is not None:
            body["details"] = self.details
        return body

    @staticmethod
    def _details(group: str, plural: str, name: str) -> dict:
        out = {"kind": plural}
        if name:
            out["name"] = name
        if group:
            out["group"] = group
        return out

    @classmethod
    def not_found(cls, group: str, plural: str, name: str) -> ApiError:
        qualified = f"{plural}.{group}" if group else plural
        return cls(404, "NotFound", f'{qualified} "{name}" not found',
                   cls._details(group, plural, name))

    @classmethod
    def already_exists(cls, group: str, plural: str, name: str) -> ApiError:
        qualified = f"{plural}.{group}" if group else plural
        return cls(409, "AlreadyExists", f'{qualified} "{name}" already exists',
                   cls._details(group, plural, name))

    @classmethod
    def conflict(cls, group: str, plural: str, name: str) -> ApiError:
        qualified = f"{plural}.{group}" if group else plural
        return cls(409, "Conflict",
                   f'Operation cannot be fulfilled on {qualified} "{name}": the object has been '
                   "modified; please apply your changes to the latest version and try again",
                   cls._details(group, plural, name))

    @classmethod
    def invalid(cls, group: str, kind: str, name: str,
                causes: list[tuple[str, str, str]]) -> ApiError:
        """causes: (reason, field, message) as in metav1.StatusCause."""
        text = "; ".join(f"{f}: {m}" if f else m for _, f, m in causes)
        details = {"name": name, "kind": kind,
                   "causes": [{"reason": r, "message": m, "field": f} for r, f, m in causes]}
        if group:
            details["group"] = group
        return cls(422, "Invalid", f'{kind} "{name}" is invalid: {text}', details)

    @classmethod
    def bad_request(cls, message: str) -> ApiError:
        return cls(400, "BadRequest", message)

    @classmethod
    def forbidden(cls, group: str, plural: str, name: str, why: str) -> ApiError:
        qualified = f"{plural}.{group}" if group else plural
        return cls(403, "Forbidden", f'{qualified} "{name}" is forbidden: {why}',
                   cls._details(group, plural, name))

    @classmethod
    def method_not_allowed(cls) -> ApiError:
        return cls(405, "MethodNotAllowed", "the server does not allow this method on the "
                   "requested resource")

    @classmethod
    def gone(cls, message: str) -> ApiError:
        return cls(410, "Expired", message)
