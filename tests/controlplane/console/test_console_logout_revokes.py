"""The console's sign-out revokes the session's token itself (issue 40): a copy of the cookie's
token no longer calls the API, and the console treats it as signed out."""

from __future__ import annotations

from controlplane.console.session import SESSION_COOKIE
from tests.controlplane.console.conftest import CONSOLE, csrf_of, signed_in


def test_sign_out_revokes_the_sessions_token(cluster):
    with signed_in(cluster) as c:
        token = c.cookies.get(SESSION_COOKIE)
        assert token
        with cluster.server.client(token) as api:
            assert api.get("/api/auth/whoami").status_code == 200
        assert c.post(f"{CONSOLE}/logout", data={"csrf": csrf_of(c.get(CONSOLE).text)}).status_code == 303
    with cluster.server.client(token) as api:
        r = api.get("/api/auth/whoami")
        assert r.status_code == 401 and r.json()["error"]["code"] == "token_revoked"
    with cluster.server.client() as replay:  # the old cookie replayed: signed out
        replay.cookies.set(SESSION_COOKIE, token)
        assert replay.get(CONSOLE, follow_redirects=False).status_code == 303
