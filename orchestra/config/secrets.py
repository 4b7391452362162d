"""Secrets never belong in a config: it is saved in the run folder and in every task spec.

Checked on the raw config first, by validation and by the sweep's size check that runs before
it, so that no later message quoting part of the config can show one.
"""

from __future__ import annotations

import re
from typing import Any

from orchestra.errors import ConfigError
from orchestra.secretnames import secret_assignment, secret_key

#: config keys whose value is a dict of environment variables (``server=dict(env=...)``, Ray's
#: ``runtime_env=dict(env_vars=...)``): their names follow environment conventions (``AWS_SECRET_ACCESS_KEY``),
#: so they are checked with the variable vocabulary, not the config-key one
ENV_DICT_KEYS = ("env", "env_vars")
#: the query of a URL in a text, and query parameter names that carry a key besides the config-key ones
#: (and any ``*_signature``: a presigned URL's, ``X-Amz-Signature``, ``X-Goog-Signature``, grants access)
URL_QUERY = re.compile(r"[a-z][a-z0-9+.-]*://[^\s?#]*\?([^\s#]+)", re.IGNORECASE)
QUERY_KEYS = ("key", "sig", "signature", "access_token")
URL_CREDENTIALS = re.compile(r"[a-z][a-z0-9+.-]*://[^/@\s:]+:[^/@\s]+@", re.IGNORECASE)


def check_secrets(obj: Any, where: str, top: bool = True) -> None:
    """Refuse a value under a secret-looking key, or a URL with a user and password, anywhere in
    ``obj`` (a raw config, checked before any message could quote part of it)."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            key_where = f"{where}: {k}" if top else f"{where}.{k}"
            if secret_key(k) and v not in (None, ""):
                raise ConfigError(
                    f"{key_where}: secrets do not belong in a config; put it in an environment "
                    "variable and give its name (e.g. key_env='OPENAI_API_KEY')"
                )
            if k in ENV_DICT_KEYS and isinstance(v, dict):
                _check_env_dict(v, key_where)
            check_secrets(v, key_where, top=False)
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            check_secrets(v, f"{where}[{i}]", top=False)
    elif isinstance(obj, str) and (URL_CREDENTIALS.search(obj) or _secret_query(obj)):
        what = "a user and password in it" if URL_CREDENTIALS.search(obj) else "a key in its query"
        raise ConfigError(
            f"{where}: a URL with {what}; credentials do not belong in a config (it is "
            "saved in the run folder and in task specs): give the key through an environment variable (key_env)"
        )


def _secret_query(text: str) -> bool:
    """Whether ``text`` holds a URL whose query gives a key (``?key=...``, ``&api-key=...``, ``token=``)."""
    for m in URL_QUERY.finditer(text):
        for pair in m.group(1).split("&"):
            name, eq, value = pair.partition("=")
            name = name.replace("-", "_").lower()
            if eq and value and (secret_key(name) or name in QUERY_KEYS or name.endswith("_signature")):
                return True
    return False


def _check_env_dict(env: dict[Any, Any], where: str) -> None:
    """Refuse a secret-looking variable given with a value in clear (never repeating the value)."""
    for name, value in env.items():
        if isinstance(name, str) and isinstance(value, str) and secret_assignment(name, value):
            raise ConfigError(
                f"{where}.{name}: looks like a secret given in clear; secrets do not belong in a config (it is "
                f"saved in the run folder and in task specs): export {name} where you start orchestra and "
                f"pass it by name (a runner's forward_env=['{name}'], a model's key_env)"
            )
