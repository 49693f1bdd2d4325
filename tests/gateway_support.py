"""Requests through the gateway add-on (Traefik) while it programs a route.

Traefik writes an HTTPRoute's `Accepted` and `ResolvedRefs` before its router has the
route: until its next configuration it answers 404 (no router yet), 500 (a rule whose
backend it has not resolved yet) or 502/503 (no ready server yet). A test first waits for
the answer it expects with these codes read as "not yet"; after that, any error is one.
"""

from __future__ import annotations

import urllib.error
import urllib.request

SETTLING = (404, 500, 502, 503)


def through_gateway(
    url: str, headers: dict[str, str], settling: tuple[int, ...] = (), timeout: float = 10
) -> str | None:
    """The body of a GET through the gateway; None when it answers one of the `settling`
    codes (any other error status raises)."""
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return str(response.read().decode())
    except urllib.error.HTTPError as error:
        if error.code in settling:
            return None
        raise
