"""The config check of URLs with a key in their query (``orchestra.config.secrets``): what it refuses
and what it leaves alone."""

from __future__ import annotations

import pytest

from orchestra.config.secrets import check_secrets
from orchestra.errors import ConfigError


@pytest.mark.parametrize("url", [
    "https://generativelanguage.googleapis.com/v1beta/openai?key=AIza-x",
    "https://res.openai.azure.com/openai?api-version=2024-02-01&api-key=abc",
    "https://acct.blob.core.windows.net/c/data.jsonl?sv=2022&sig=abc%3D",
    # a presigned URL is a credential until it expires (before: accepted and saved with the config)
    "https://bucket.s3.amazonaws.com/data.jsonl?X-Amz-Algorithm=AWS4&X-Amz-Signature=0123abcd",
    "https://storage.googleapis.com/b/data.jsonl?X-Goog-Algorithm=GOOG4&X-Goog-Signature=0123abcd",
])
def test_a_key_in_a_query_is_refused_naming_the_key_path(url: str) -> None:
    with pytest.raises(ConfigError, match=r"^cfg\.py: models\[0\]\.base_url: a URL with a key in its query;") as info:
        check_secrets({"models": [{"base_url": url}]}, "cfg.py")
    assert url.split("?")[1] not in str(info.value)


@pytest.mark.parametrize("url", [
    "https://res.openai.azure.com/openai/deployments/gpt4?api-version=2024-02-01",
    "https://huggingface.co/datasets/x/resolve/main/data.jsonl?download=true",
    "https://host/v1?max_tokens=16&tokenizer=gpt2&sort_key=id",
])
def test_a_query_without_a_key_is_accepted(url: str) -> None:
    check_secrets({"models": [{"base_url": url}]}, "cfg.py")
