"""Dashboard sessions and CSRF tokens.

A browser cannot send the API's bearer token, so the dashboard has its own session: a cookie
(HttpOnly, SameSite=Strict, Path=/ui) holding `issued.nonce.mac`, where nonce is the random
session id (32 bytes) and mac is an HMAC over `issued.nonce` with a key derived from the
server's token. With a token, signing in also records the session in the store (only the
SHA-256 of its nonce: store/sessions.py), and every request needs that row live: signing out
revokes it, so a copied cookie stops working at once; sessions outlive a restart of a server
with the same token, end when the token changes (the mac no longer matches), and expire
SESSION_TTL after sign-in. Without a token the key is random per process and every visitor
gets a session at once (there is nothing to ask for, so nothing is stored), so forms still
carry CSRF tokens: another site cannot post to a dashboard on localhost.

Every form (sign-out included) carries `csrf` = HMAC(key, "csrf:" + nonce): bound to the
session, so a form from an older session or another server is refused as stale.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import time

COOKIE = "tether_ui"
SESSION_TTL = 12 * 3600.0


class UiAuth:
    def __init__(self, token: str | None) -> None:
        self.token = token.encode() if token else None
        self._key = (hmac.new(self.token, b"tether-dashboard-session", hashlib.sha256).digest()
                     if self.token else os.urandom(32))

    @property
    def required(self) -> bool:
        """The visitor must sign in with the token before anything else."""
        return self.token is not None

    def check_token(self, given: str) -> bool:
        return self.token is not None and hmac.compare_digest(
            given.strip().encode("utf-8", "replace"), self.token)

    def _mac(self, text: str) -> str:
        return hmac.new(self._key, text.encode(), hashlib.sha256).hexdigest()

    def new_session(self) -> str:
        body = f"{int(time.time())}.{secrets.token_urlsafe(32)}"
        return f"{body}.{self._mac(body)}"

    def session(self, cookie: str | None) -> str | None:
        """The session's nonce if the cookie is one this key issued and has not expired."""
        if not cookie or len(cookie) > 200 or not cookie.isascii():
            return None  # compare_digest refuses non-ASCII str: a crafted byte is no session
        issued, _, rest = cookie.partition(".")
        nonce, _, mac = rest.partition(".")
        if not (issued.isdigit() and nonce and mac):
            return None
        if not hmac.compare_digest(mac, self._mac(f"{issued}.{nonce}")):
            return None
        if not 0 <= time.time() - int(issued) < SESSION_TTL:
            return None
        return nonce

    @staticmethod
    def digest(nonce: str) -> str:
        """What the store keeps of a session: the SHA-256 (hex) of its nonce, never the nonce
        (a read of the table gives no cookie)."""
        return hashlib.sha256(nonce.encode()).hexdigest()

    def csrf(self, nonce: str) -> str:
        return self._mac("csrf:" + nonce)

    def check_csrf(self, nonce: str | None, given: str | None) -> bool:
        return bool(nonce and given) and str(given).isascii() and hmac.compare_digest(
            str(given), self.csrf(str(nonce)))
