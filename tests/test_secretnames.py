"""``orchestra.secretnames``: the one place that says which names look like they hold a secret."""

from __future__ import annotations

import re
from typing import Any

from orchestra.config.dump import redact
from orchestra.secretnames import SECRET_KEY, SECRET_VARIABLE, secret_assignment, secret_key

#: the rule config keys had before it moved here (config/validate.py), to prove nothing changed
_OLD_CONFIG_RULE = re.compile(r"(^|_)(api_?key|token|secret|password)$", re.IGNORECASE)
#: the rule DLC's extra_envs had before it moved here (runners/dlc/config.py)
_OLD_ENV_RULE = re.compile(r"(?:^|_)(?:[A-Z]*TOKEN|[A-Z]*KEY|SECRET|PASSWORD|PASSWD|CREDENTIALS?)S?(?:_|$)", re.I)

NAMES = ["api_key", "apikey", "openai_api_key", "hf_token", "token", "secret", "password", "db_password",
         "key_env", "max_tokens", "max_new_tokens", "sort_key", "key", "tokenizer", "HF_TOKEN", "OPENAI_API_KEY",
         "AWS_SECRET_ACCESS_KEY", "DB_PASSWD", "GOOGLE_CREDENTIALS", "APIKEY", "KEYBOARD", "HF_HOME",
         "TOKENIZERS_PARALLELISM", "HUGGING_FACE_HUB_TOKEN", "my_secret_value", "passwords", "x_credential"]


def test_the_rules_are_the_ones_that_were_in_force() -> None:
    for name in NAMES:
        assert secret_key(name) == bool(_OLD_CONFIG_RULE.search(name)), name
        assert bool(SECRET_VARIABLE.search(name)) == bool(_OLD_ENV_RULE.search(name)), name


def test_every_secret_config_key_is_also_a_secret_variable_name() -> None:
    """The variable rule is the wider one: a name redacted in a config is never accepted in clear."""
    for name in NAMES:
        if SECRET_KEY.search(name):
            assert SECRET_VARIABLE.search(name), name


def test_config_keys_that_name_no_secret_stay_readable() -> None:
    dumped = redact({"key_env": "OPENAI_API_KEY", "max_tokens": 16, "sort_key": "id", "api_key": "sk-1",
                     "nested": [{"hf_token": "t"}]})
    assert dumped == {"key_env": "OPENAI_API_KEY", "max_tokens": 16, "sort_key": "id", "api_key": "<redacted>",
                      "nested": [{"hf_token": "<redacted>"}]}


def test_an_assignment_is_a_secret_unless_it_refers_to_a_variable() -> None:
    assert secret_assignment("HF_TOKEN", "hf_abc")
    assert secret_assignment("DB_PASSWORD", "$HOME-and-more")
    assert not secret_assignment("HF_TOKEN", "$HF_TOKEN_IN_IMAGE")
    assert not secret_assignment("HF_TOKEN", "${HF_TOKEN_IN_IMAGE}")
    assert not secret_assignment("HF_TOKEN", "")
    assert not secret_assignment("HF_HOME", "/data/hf")


def test_counts_switches_and_paths_under_a_secret_word_are_no_secret(tmp_path: Any) -> None:
    """A server's or a Ray job's harmless settings were refused as secrets given in clear (exit 2):
    ``MAX_TOKENS=4096``, ``PAD_TOKEN_ID=0``, ``GOOGLE_APPLICATION_CREDENTIALS=<a path>``."""
    creds = tmp_path / "gcp.json"
    creds.write_text("{}")
    for name, value in [("MAX_TOKENS", "4096"), ("PAD_TOKEN_ID", "0"), ("NUM_KEYS", "3"), ("USE_KEY_CACHE", "true"),
                        ("GOOGLE_APPLICATION_CREDENTIALS", str(creds)), ("SSH_KEY_PATH", str(tmp_path))]:
        assert not secret_assignment(name, value), name
    # still secrets: a key, a numeric password, a path-like value that is no file here (base64 has '/')
    for name, value in [("HF_TOKEN", "hf_abc"), ("DB_PASSWORD", "12345678"), ("APP_SECRET", "1"),
                        ("AWS_SECRET_ACCESS_KEY", "/AbCd+efGH/ijkl"), ("API_KEY", "1234567890"),
                        ("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "missing.json"))]:
        assert secret_assignment(name, value), name


def test_secret_variables_picks_the_names_that_say_secret() -> None:
    from orchestra.secretnames import secret_variables

    env = ["PATH", "HOME", "OPENAI_API_KEY", "HF_TOKEN", "TOKENIZERS_PARALLELISM", "AWS_SECRET_ACCESS_KEY",
           "SLURM_CONF", "DB_PASSWORD", "KEYTAB_DIR", "PYTHONHASHSEED"]
    assert secret_variables(env) == ["AWS_SECRET_ACCESS_KEY", "DB_PASSWORD", "HF_TOKEN", "OPENAI_API_KEY"]
