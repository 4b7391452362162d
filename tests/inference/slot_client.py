"""A separate process that sends requests through OpenAIAPI (for host-wide limit tests).

    python slot_client.py BASE_URL MAX_CONNECTIONS TAG N [PROMPT]
"""

from __future__ import annotations

import asyncio
import json
import sys

from orchestra.models.openai_api import OpenAIAPI
from orchestra.requests import GenRequest


async def main(base_url: str, conns: int, tag: str, n: int, prompt: str) -> None:
    model = OpenAIAPI(abbr=tag, path="test-model", base_url=base_url, key_env=None, max_connections=conns)
    try:
        out = await asyncio.gather(*(model.generate(GenRequest(prompt=prompt.format(tag=tag, i=i)))
                                     for i in range(n)))
    finally:
        await model.aclose()
    print(json.dumps(out))


if __name__ == "__main__":
    base, conns, tag, n = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    prompt = sys.argv[5] if len(sys.argv) > 5 else "{tag}{i}: {i} + 1"
    asyncio.run(main(base, conns, tag, n, prompt))
