"""The dashboard's defences, kept apart from the web framework so each rule reads alone.

* **Where it listens.** Loopback by default. Any other address needs a token: a
  dashboard replays and purges dead letters, so an open one on a network is an open
  door. :func:`check_bind` refuses to start otherwise.
* **Who may use it.** With a token, every request (pages, JSON, assets) must carry it,
  as ``Authorization: Bearer <token>`` (scripts) or as the password of HTTP Basic auth
  with any user name (browsers ask for it themselves after a 401).
* **Which Host it answers.** On loopback only loopback names, so a web page that
  rebinds its own DNS name to 127.0.0.1 cannot read the dashboard from a browser.
* **Forged actions (CSRF).** Actions are POSTs of JSON that must carry the header
  ``X-CSRF-Token`` equal to the ``pyqueue_csrf`` cookie, a value signed with a secret of
  this process (double submit, signed so that a cookie planted by a sibling domain is
  useless), and, if the browser sent an ``Origin``, it must be this dashboard's own. A
  browser attaches Basic credentials and cookies to a forged cross-site request, but a
  foreign page can neither read the cookie nor set the header. A request authenticated
  by a Bearer header needs no CSRF token: browsers never add that header by themselves.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import ipaddress
import secrets
from urllib.parse import urlsplit

from pyqueue.protocol.errors import PyQueueError

#: A token shorter than this is refused: it guards replay and purge of every queue.
MIN_TOKEN_LENGTH = 16
CSRF_COOKIE = "pyqueue_csrf"
CSRF_HEADER = "x-csrf-token"
REALM = "pyqueue dashboard"


class DashboardRefused(PyQueueError):
    """The dashboard's configuration is unsafe, so it will not start."""


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address, IPv6 with or without brackets) is this
    machine only."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind(host: str, token: str | None) -> None:
    """Refuse, loudly, to listen beyond loopback without a token, or with a short one."""
    if token is not None and len(token) < MIN_TOKEN_LENGTH:
        raise DashboardRefused(
            f"the dashboard token must be at least {MIN_TOKEN_LENGTH} characters "
            '(make one with: python -c "import secrets; print(secrets.token_urlsafe())")'
        )
    if not is_loopback(host) and not token:
        raise DashboardRefused(
            f"refusing to serve the dashboard on {host!r} without a token: anyone who can reach it could replay "
            "and purge dead letters. Pass --token (or set PYQUEUE_DASHBOARD_TOKEN), or bind 127.0.0.1"
        )


def loopback_hosts(bind: str) -> set[str]:
    """The Host header names a loopback-bound dashboard answers to."""
    return {"localhost", "127.0.0.1", "::1", bind.strip("[]").lower()}


def host_name(header: str) -> str:
    """The name part of a Host header: ``[::1]:8080`` -> ``::1``, ``a:80`` -> ``a``."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1 : header.find("]")] if "]" in header else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


def authorized(token: str, authorization: str | None) -> str | None:
    """How the request proved it knows ``token``: ``"bearer"``, ``"basic"``, or None.
    Comparisons take constant time."""
    if not authorization:
        return None
    scheme, _, value = authorization.partition(" ")
    value = value.strip()
    if scheme.lower() == "bearer":
        return "bearer" if hmac.compare_digest(value.encode(), token.encode()) else None
    if scheme.lower() == "basic":
        try:
            decoded = base64.b64decode(value, validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            return None
        _user, sep, password = decoded.partition(":")
        return "basic" if sep and hmac.compare_digest(password.encode(), token.encode()) else None
    return None


class Csrf:
    """Signed double-submit tokens: ``<nonce>.<HMAC-SHA256(secret, nonce)>``. The secret
    lives in this process only, so a restart invalidates every page's token (a reload
    fetches a new one)."""

    def __init__(self, secret: bytes | None = None) -> None:
        self.secret = secret if secret is not None else secrets.token_bytes(32)

    def _sign(self, nonce: str) -> str:
        return hmac.new(self.secret, nonce.encode(), hashlib.sha256).hexdigest()

    def new_token(self) -> str:
        nonce = secrets.token_urlsafe(18)
        return f"{nonce}.{self._sign(nonce)}"

    def signed(self, token: str) -> bool:
        nonce, sep, mac = token.partition(".")
        return bool(sep and nonce) and hmac.compare_digest(mac.encode(), self._sign(nonce).encode())

    def check(self, cookie: str | None, header: str | None) -> bool:
        """The header repeats the cookie, and the value was signed here."""
        if not cookie or not header:
            return False
        return hmac.compare_digest(cookie.encode(), header.encode()) and self.signed(header)


def same_origin(origin: str | None, host: str | None) -> bool:
    """An ``Origin`` header, if the browser sent one, names this dashboard's host. Only
    the host and port are compared: behind a TLS-terminating proxy the scheme differs."""
    if origin is None:
        return True
    if origin == "null" or not host:
        return False
    return urlsplit(origin).netloc.lower() == host.strip().lower()
