"""What makes a name look like it holds a secret: the one place orchestra decides that.

A secret reaches a task through an environment variable given by *name* (``key_env``,
``forward_env``), never as a value in a config, an argv or a log.  Two kinds of names are checked,
with one vocabulary of secret words (token, key, secret, password, passwd, credentials):

* a **config key** (``api_key='sk-...'``, ``hf_token=...``): refused by the config check and
  redacted when the config is dumped.  A config key is snake_case and names what it holds by its
  last word, where ``key`` and ``tokens`` usually mean something else (``sort_key``, ``key_env``,
  ``max_tokens``), so only a last word ``token``, ``secret``, ``password``, or ``api_key`` /
  ``apikey`` counts.
* an **environment variable** given with a value in clear (DLC's ``extra_envs``): any word of the
  name counts, and a word may carry a prefix or a plural (``HF_TOKEN``, ``OPENAI_API_KEY``,
  ``AWS_SECRET_ACCESS_KEY``, ``GOOGLE_CREDENTIALS``, ``APIKEY``), since variables are named
  by convention and a wrong refusal only asks the user to pass the variable by name instead.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable

#: a config key whose value would be a secret (matched case-insensitively against the whole key)
SECRET_KEY = re.compile(r"(^|_)(api_?key|token|secret|password)$", re.IGNORECASE)
#: an environment variable name that says it holds a secret
SECRET_VARIABLE = re.compile(r"(?:^|_)(?:[A-Z]*TOKEN|[A-Z]*KEY|SECRET|PASSWORD|PASSWD|CREDENTIALS?)S?(?:_|$)",
                             re.IGNORECASE)
#: a valid environment variable name (a shell identifier): what may be written unquoted in ``export NAME=``
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: a value that only refers to another variable (``$NAME`` or ``${NAME}``): it holds no secret itself
VARIABLE_REFERENCE = re.compile(r"\$(?:\{[A-Za-z_][A-Za-z0-9_]*\}|[A-Za-z_][A-Za-z0-9_]*)")


def secret_key(key: object) -> bool:
    """Whether a config key names a secret (its value is refused, and redacted in dumps)."""
    return SECRET_KEY.search(str(key)) is not None


#: a value that is a count, a size or a switch (``MAX_TOKENS=4096``, ``PAD_TOKEN_ID=0``, ``NUM_KEYS=3``):
#: never an API key or a token; a password or a secret may still be all digits, so not for those names
PLAIN_SETTING = re.compile(r"-?[0-9]{1,9}(?:\.[0-9]+)?|true|false|yes|no|on|off", re.IGNORECASE)
_PASSWORD_LIKE = re.compile(r"SECRET|PASSW", re.IGNORECASE)


def secret_assignment(name: str, value: str) -> bool:
    """Whether ``NAME=value`` gives a secret in clear: a secret-looking variable name with a value
    that is more than empty or a ``$VAR`` reference (a reference to the container's own variable),
    a path of an existing file or folder (``GOOGLE_APPLICATION_CREDENTIALS=/etc/gcp.json``: where
    a secret is, not the secret), or, unless the name says password or secret, a number or a switch."""
    if SECRET_VARIABLE.search(name) is None or value == "" or VARIABLE_REFERENCE.fullmatch(value):
        return False
    if os.path.isabs(value) and os.path.exists(value):
        return False
    return not (PLAIN_SETTING.fullmatch(value) and not _PASSWORD_LIKE.search(name))


def secret_variables(names: Iterable[str]) -> list[str]:
    """The names among ``names`` (e.g. an environment's) that say they hold a secret and are valid
    variable names, sorted."""
    return sorted(n for n in names if SECRET_VARIABLE.search(n) and ENV_NAME.fullmatch(n))
