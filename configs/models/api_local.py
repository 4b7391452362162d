# An OpenAI-compatible endpoint on this machine (vLLM, SGLang, or tests/servers/openai_server.py).
# Point it elsewhere with --cfg-options models.0.base_url=http://host:port/v1 models.0.path=NAME
# The key, if the endpoint wants one, is read from the environment variable named by key_env.
from orchestra.models import OpenAIAPI

models = [
    dict(type=OpenAIAPI, abbr='api-local', path='test-model', base_url='http://127.0.0.1:8000/v1',
         key_env='ORCHESTRA_API_KEY', max_connections=50, max_retries=8, timeout_s=600.0,
         attempt_timeout_s=120.0, max_out_len=32),
]
