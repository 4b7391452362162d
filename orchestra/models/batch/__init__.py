"""Batch mode of the API models (``batch=...`` on :class:`~orchestra.models.openai_api.OpenAIAPI`
and :class:`~orchestra.models.anthropic_api.AnthropicAPI`): every request through the provider's
batch API, recorded in the run folder before anything relies on it.  One module per job:

    options.py    BatchOptions: the ``batch`` option, what the user sets
    rows.py       a row's custom_id, result-file lines, the rows a task waits for and their fate
    ledger.py     <run>/batches/<model>.jsonl: every batch, recorded before it is relied on
    spool.py      <run>/batches/<model>.spool/<host>/: the requests of every task of a model
    leader.py     the spool's leader: cuts the spooled requests into batches and creates them
    feed.py       one task's way into batches: queue, spool, follow the ledger
    batcher.py    Batcher, one task's loop: submit, resume, poll, collect, stop
    provider.py   BatchProvider: what the batcher asks of a provider (a Protocol)
    openai.py     OpenAI's Files + Batches: request and answer shapes, endpoints
    anthropic.py  Anthropic's Message Batches: request and answer shapes, endpoints
    transport.py  BatchTransport: the retrying HTTP calls both providers send

See docs/api.md, "Batch mode".
"""
