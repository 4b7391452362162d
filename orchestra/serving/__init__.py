"""Managed inference servers: replicas of vLLM, SGLang, llama.cpp or any OpenAI-compatible
server that a run starts, balances, guards and stops itself (docs/serving.md).

``spec`` (the ``server=dict(...)`` of an ``OpenAIAPI`` model and the engines' presets) and
``balance`` (the client side: which replica a request goes to) are what models use; ``replica``,
``pool`` and ``watchdog`` are the lifecycle the scheduling layer drives through ``hook``.
This package imports nothing above ``orchestra.limits``: the runners reach it through a hook.
"""
