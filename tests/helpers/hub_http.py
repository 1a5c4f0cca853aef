"""A user of the class's JupyterHub over plain HTTP, as a browser would be without the pages: the hub's login form
(with its XSRF cookie), the hub's REST API with the login's cookie, and the user's server through the hub's
proxy (its OAuth redirects followed as a browser follows them). For tiers that test where servers run, not
what JupyterLab shows (tests/helpers/hub_browser.py is the browser's)."""
from __future__ import annotations

import requests

from tests.helpers.hub import poll


class HubUser:
    def __init__(self, base: str, user: str, password: str):
        self.base, self.user, self.password = base, user, password
        self.http = requests.Session()

    def _xsrf(self) -> dict:
        return {"X-XSRFToken": self.http.cookies.get("_xsrf", path="/hub/") or ""}

    def log_in(self) -> None:
        """The login form, sent as the login page would send it; the hub then starts the user's server (its
        redirect to /hub/spawn), which :meth:`wait_ready` waits for."""
        self.http.get(f"{self.base}/hub/login", timeout=60).raise_for_status()
        sent = self.http.post(f"{self.base}/hub/login", timeout=120, allow_redirects=False, data={
            "username": self.user, "password": self.password, "_xsrf": self.http.cookies.get("_xsrf", path="/hub/")})
        assert sent.status_code == 302, f"{self.user}'s login: {sent.status_code} {sent.text[:500]}"
        # the redirect's target (/hub/ then /hub/spawn) starts the server; it answers before the server is up
        self.http.get(f"{self.base}{sent.headers['Location']}", timeout=120, allow_redirects=False)
        self.http.post(f"{self.base}/hub/api/users/{self.user}/server", headers=self._xsrf(), timeout=120)

    def api(self, path: str, method: str = "GET") -> requests.Response:
        """``/hub/api/PATH`` with the login's cookie."""
        return self.http.request(method, f"{self.base}/hub/api/{path}", headers=self._xsrf(), timeout=120)

    def server(self) -> dict:
        """The user's default server as the hub's API describes it ({} when none)."""
        return self.api(f"users/{self.user}").json().get("servers", {}).get("", {})

    def wait_ready(self, timeout: float = 180) -> bool:
        return bool(poll(lambda: self.server().get("ready"), timeout=timeout, interval=0.5))

    def get(self, path: str) -> requests.Response:
        """``/user/NAME/PATH`` through the proxy, as the user's browser gets it: the first time, the lab's page
        (the server's OAuth redirects through the hub, which give the server's own cookie), then PATH with the
        server's XSRF token, as JupyterLab sends it with every API call."""
        server = f"/user/{self.user}/"
        if self.http.cookies.get("_xsrf", path=server) is None:
            self.http.get(f"{self.base}{server}lab", timeout=120).raise_for_status()
        token = self.http.cookies.get("_xsrf", path=server) or ""
        return self.http.get(f"{self.base}{server}{path}", headers={"X-XSRFToken": token}, timeout=120)

    def stop_server(self) -> int:
        return self.api(f"users/{self.user}/server", method="DELETE").status_code
