"""Limits on calls that leave a task: how many at once, how fast, and how they are retried.

* ``concurrency``: named concurrency scopes, per process or host-wide (``flock`` slots).
* ``ratelimit``: a client-side request pace that learns an endpoint's limit from 429s.
* ``retry``: the retry policy, the one classifier of failed attempts and the one retry loop.

API models use them today; heavy scorers (sandboxed code, judge models) share the same
host-wide scopes.  Nothing here knows about models or tasks.
"""
