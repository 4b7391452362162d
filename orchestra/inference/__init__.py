"""The inference engine that runs inside an infer task.

* ``engine``: samples as coroutines on one asyncio loop, multi-turn conversations, live counters.
* ``checkpoint``: sample-level, append-only checkpoints (durable before a sample counts).

Concurrency scopes, the request pace and retries of calls live in :mod:`orchestra.limits`.
See docs/api.md.
"""
