"""The aiohttp sessions of an HTTP model: one for its endpoint, one per managed replica on a
Unix socket, and the key kept out of every repr.

aiohttp is imported inside the functions, so that importing a model module to validate a config
stays cheap.
"""

from __future__ import annotations

from typing import Any


class Secret:
    """Holds an API key; its repr never shows it."""

    __slots__ = ("value",)

    def __init__(self, value: str) -> None:
        self.value = value

    def __repr__(self) -> str:
        return "<secret>" if self.value else "<no key>"


def open_session(limit: int, headers: dict[str, str], socket_path: str = "") -> Any:
    """A ``ClientSession`` of at most ``limit`` connections sending ``headers``, without cookies or
    a total timeout (each request sets its own); over the Unix socket ``socket_path`` if given (a
    managed replica in a private folder), else over TCP."""
    import aiohttp

    connector: Any
    if socket_path:
        connector = aiohttp.UnixConnector(path=socket_path, limit=limit, keepalive_timeout=30)
    else:
        connector = aiohttp.TCPConnector(limit=limit, limit_per_host=0, keepalive_timeout=30, ttl_dns_cache=300)
    return aiohttp.ClientSession(connector=connector, headers=headers, cookie_jar=aiohttp.DummyCookieJar(),
                                 timeout=aiohttp.ClientTimeout(total=None))


def env_proxy(url: str) -> tuple[Any, Any]:
    """The proxy (and its credentials) the environment names for ``url``, looked up once: aiohttp's
    ``trust_env=True`` would do it (and a netrc lookup) on a thread for every request."""
    from aiohttp.helpers import get_env_proxy_for_url
    from yarl import URL

    try:
        proxy, auth = get_env_proxy_for_url(URL(url))
    except LookupError:
        return None, None
    return proxy, auth
