"""Access control of the HTTP server: API key, Host check, JSON-only bodies, CORS.

- **API key** (`api_key`): every path but `public_paths` (default `/health`, `/metrics`)
  and the web chat's static files needs `Authorization: Bearer <key>`; the key is
  compared in constant time (`hmac.compare_digest`). Otherwise 401 in OpenAI's shape
  (`code: "invalid_api_key"`) with `WWW-Authenticate: Bearer`.
- **Host check** (`allowed_hosts`): a server bound to a loopback address serves only
  loopback `Host` values (`localhost`, `127.x.x.x`, `[::1]`, any port) unless hosts are
  listed, which stops DNS rebinding: a web page whose name resolves to 127.0.0.1 sends
  its own name as `Host`. A request with another Host is a 421. `*` allows any.
- **JSON bodies**: the POST routes need `Content-Type: application/json` (415
  otherwise), so a cross-origin "simple request" (`text/plain`, forms) never reaches
  them; a JSON POST from another origin needs a CORS preflight, which fails unless
  `cors_origins` lists that origin (Starlette's `CORSMiddleware`).

`AccessPolicy` holds these knobs and checks them once (the CLI and the library share
it); `install_access_control(app, policy)` adds the middleware (outermost first: Host
check, CORS, API key).
"""

from __future__ import annotations

import hmac
import ipaddress
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from starlette.middleware.cors import CORSMiddleware

from .errors import APIError

DEFAULT_PUBLIC_PATHS = ("/health", "/metrics")
WEB_CHAT_PATHS = ("/", "/favicon.ico")
WEB_CHAT_PREFIX = "/static/"
LOOPBACK_NAMES = ("localhost",)
JSON_TYPES = ("application/json",)


@dataclass(frozen=True)
class AccessPolicy:
    """Who may use the server.

    Args:
        api_key: the Bearer key every non-public path needs; None: no key.
        public_paths: paths served without the key (exact matches).
        allowed_hosts: accepted `Host` names (no port; `*` = any); None: any.
        cors_origins: origins allowed by CORS (`*` = any); empty: no CORS headers.

    Raises:
        ValueError: an empty key, a public path not starting with `/`, an empty host or
            origin, or `allowed_hosts` given with no host (which would refuse every request),
            naming the knob.
    """

    api_key: str | None = None
    public_paths: tuple[str, ...] = DEFAULT_PUBLIC_PATHS
    allowed_hosts: tuple[str, ...] | None = None
    cors_origins: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.api_key is not None and (not isinstance(self.api_key, str) or not self.api_key.strip()):
            raise ValueError("api_key must be a non-empty string")
        for path in self.public_paths:
            if not isinstance(path, str) or not path.startswith("/"):
                raise ValueError(f"public_paths entries must start with '/', got {path!r}")
        if self.allowed_hosts is not None and not self.allowed_hosts:
            raise ValueError("allowed_hosts must name at least one host ('*' for any); an empty list would "
                             "refuse every request")
        for name, values in (("allowed_hosts", self.allowed_hosts or ()), ("cors_origins", self.cors_origins)):
            for value in values:
                if not isinstance(value, str) or not value or any(c.isspace() for c in value):
                    raise ValueError(f"{name} entries must be non-empty names without spaces, got {value!r}")

    @classmethod
    def for_bind(cls, host: str, api_key: str | None = None, public_paths: tuple[str, ...] = DEFAULT_PUBLIC_PATHS,
                 allowed_hosts: tuple[str, ...] | None = None, cors_origins: tuple[str, ...] = ()) -> AccessPolicy:
        """The policy of a server bound to `host`: loopback binds accept only loopback Host
        values unless `allowed_hosts` is given; other binds accept any unless given."""
        if allowed_hosts is None and is_loopback(host):
            allowed_hosts = ("localhost", "127.0.0.1", "::1")
        return cls(api_key, tuple(public_paths), allowed_hosts, tuple(cors_origins))

    def needs_key(self, path: str) -> bool:
        """Whether `path` needs the API key (never without one)."""
        if self.api_key is None or path in self.public_paths or path in WEB_CHAT_PATHS:
            return False
        return not path.startswith(WEB_CHAT_PREFIX)

    def key_matches(self, authorization: bytes | None) -> bool:
        """Constant-time check of an `Authorization` header value against `Bearer <key>`."""
        expected = b"Bearer " + self.api_key.encode("utf-8")
        return authorization is not None and hmac.compare_digest(authorization.strip(), expected)

    def host_allowed(self, host_header: bytes | None) -> bool:
        """Whether a `Host` header value (port ignored) is served; no header is (not a browser)."""
        if self.allowed_hosts is None or "*" in self.allowed_hosts or host_header is None:
            return True
        name = host_name(host_header.decode("latin-1"))
        if name in self.allowed_hosts:
            return True
        return is_loopback(name) and any(is_loopback(host) for host in self.allowed_hosts)


def is_loopback(host: str) -> bool:
    """`localhost`, a 127.0.0.0/8 address or ::1."""
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def host_name(value: str) -> str:
    """The name of a Host header value, without its port (`[::1]:8000` -> `::1`)."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1:value.find("]")] if "]" in value else ""
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


class AccessMiddleware:
    """ASGI middleware: the Host check (421) or the API-key check (401) of `policy`.

    Args:
        app: the wrapped ASGI app.
        policy: the access policy.
        check: "host" or "key".
    """

    def __init__(self, app: Any, policy: AccessPolicy, check: str):
        self.app = app
        self.policy = policy
        self.check = check

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            error = self.refusal(scope)
            if error is not None:
                await error.response()(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def refusal(self, scope: dict) -> APIError | None:
        """The error for this request, or None to serve it."""
        headers = dict(scope.get("headers") or [])
        if self.check == "host":
            if self.policy.host_allowed(headers.get(b"host")):
                return None
            return APIError("Invalid Host header: this server does not serve that host name (see --allowed-hosts)",
                            param="Host", status=421)
        if scope.get("method") == "OPTIONS" or not self.policy.needs_key(scope.get("path", "")):
            return None
        if self.policy.key_matches(headers.get(b"authorization")):
            return None
        return APIError("Incorrect or missing API key: send 'Authorization: Bearer <key>'", status=401,
                        code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})


def install_access_control(app: FastAPI, policy: AccessPolicy) -> None:
    """Add the API-key check, CORS (when origins are listed) and the Host check, outermost last."""
    if policy.api_key is not None:
        app.add_middleware(AccessMiddleware, policy=policy, check="key")
    if policy.cors_origins:
        app.add_middleware(CORSMiddleware, allow_origins=list(policy.cors_origins),
                           allow_methods=["GET", "POST", "OPTIONS"],
                           allow_headers=["Authorization", "Content-Type"])
    if policy.allowed_hosts is not None and "*" not in policy.allowed_hosts:
        app.add_middleware(AccessMiddleware, policy=policy, check="host")


def require_json(request: Request) -> None:
    """415 unless the request says its body is JSON (`application/json`, parameters allowed).

    Raises:
        APIError: 415 naming the `Content-Type` header.
    """
    content_type = request.headers.get("content-type", "")
    if content_type.split(";", 1)[0].strip().lower() not in JSON_TYPES:
        raise APIError(f"Unsupported Content-Type {content_type!r}: send the body as JSON with "
                       "'Content-Type: application/json'", param="Content-Type", status=415)
