"""The inference engine that runs inside an infer task.

* ``engine``: samples as coroutines on one asyncio loop, multi-turn conversations, live counters.
* ``checkpoint``: sample-level, append-only checkpoints (durable before a sample counts).
* ``concurrency``: named concurrency scopes, per process or host-wide (``flock`` slots).
* ``ratelimit``: a client-side request pace that learns an endpoint's limit from 429s.
* ``retry``: the retry policy and the one classifier of failed attempts.

See docs/api.md.
"""
