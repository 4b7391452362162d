"""ServerSpec and the engines' presets: what a config may say, and the argv each replica runs.

The vLLM and SGLang argv are checked against their documented flags (docs/serving.md cites the
pages): ``vllm serve MODEL --uds SOCKET --served-model-name --tensor-parallel-size`` with the key
in ``VLLM_API_KEY`` (a Unix socket in a private folder: vLLM's key guards only ``/v1`` routes);
``python -m sglang.launch_server --model-path --host --port --served-model-name --tp-size`` with
``--api-key`` added inside the process.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from orchestra.errors import ConfigError
from orchestra.serving.presets import KEY_FILE_ENV, launch
from orchestra.serving.spec import check_gpus, parse_server


def test_refusals_name_the_key_and_what_is_valid(tmp_path: Path) -> None:
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    cases = [
        (dict(engine="tgi", model=str(gguf)), "server.engine must be one of vllm, sglang, llama.cpp, command"),
        (dict(engine="llama.cpp", model=str(gguf), replicas=0), "server.replicas must be an integer from 1 to 64"),
        (dict(engine="llama.cpp", model=str(gguf), replicas=10**6), "server.replicas must be an integer from 1 to 64"),
        (dict(engine="llama.cpp", model=str(tmp_path / "nope.gguf")), "llama.cpp needs a GGUF file"),
        (dict(engine="vllm", model=str(tmp_path / "ckpt")), "does not exist"),
        (dict(engine="vllm", model="org/name", threads=2), "server.threads does not apply to engine 'vllm'"),
        (dict(engine="vllm", model="org/name", colour=1), "unknown key 'colour'; valid keys: engine, model"),
        (dict(engine="command", model="x", command=["srv", "--port", "{prot}"]), "unknown field {prot}"),
        (dict(engine="command", model="x", command=["srv", "--port", "8000"]), "or on {socket}"),
        (dict(engine="llama.cpp", model=str(gguf), ready_path="health"), "must be a path starting with '/'"),
    ]
    for cfg, expected in cases:
        with pytest.raises(ConfigError) as err:
            parse_server(cfg)
        assert expected in str(err.value), (cfg, str(err.value))
        assert "\n" not in str(err.value)


def test_a_hub_id_is_not_looked_for_on_disk() -> None:
    spec = parse_server(dict(engine="vllm", model="HuggingFaceTB/SmolLM2-135M-Instruct", tensor_parallel_size=2))
    assert spec.gpus_per_replica == 2 and spec.supports_loglik


def test_more_gpus_than_the_runner_has_is_refused() -> None:
    spec = parse_server(dict(engine="vllm", model="org/m", replicas=2, tensor_parallel_size=4))
    check_gpus(spec, 8, "cfg.py: models[0]")
    with pytest.raises(ConfigError, match=r"2 replica\(s\) x 4 GPU\(s\) = 8 GPU\(s\), but this machine's runner has 7"):
        check_gpus(spec, 7, "cfg.py: models[0]")
    check_gpus(parse_server(dict(engine="command", model="m", command="srv {port}")), 0, "x")  # no GPU needed


def test_vllm_argv_follows_its_documented_flags_and_keeps_the_key_out() -> None:
    spec = parse_server(dict(engine="vllm", model="org/m", tensor_parallel_size=2, args=["--max-model-len", "4096"]))
    how = launch(spec, "m-served", 0, "/private/k.key", ["2", "3"], "/private/s/r.sock")
    assert how.argv == ("vllm", "serve", "org/m", "--uds", "/private/s/r.sock",
                        "--served-model-name", "m-served", "--tensor-parallel-size", "2", "--max-model-len", "4096")
    assert how.key_env == ("VLLM_API_KEY",)
    assert how.env["CUDA_VISIBLE_DEVICES"] == "2,3" and how.env[KEY_FILE_ENV] == "/private/k.key"
    assert not any("api-key" in a for a in how.argv)


def test_sglang_argv_follows_its_documented_flags() -> None:
    spec = parse_server(dict(engine="sglang", model="org/m", tensor_parallel_size=4))
    how = launch(spec, "m", 30001, "/k", ["0", "1", "2", "3"])
    assert how.argv[:5] == (sys.executable, "-m", "orchestra.serving.launch_with_key", "--api-key",
                            "sglang.launch_server")
    assert how.argv[5:] == ("--model-path", "org/m", "--host", "127.0.0.1", "--port", "30001",
                            "--served-model-name", "m", "--tp-size", "4")


def test_command_template_is_filled_per_argument(tmp_path: Path) -> None:
    hostile = "model; rm -rf ~ '$(x)'"
    spec = parse_server(dict(engine="command", model=hostile,
                             command="my-server --port {port} --model {model} --key-file {key_file}"))
    how = launch(spec, "n", 5000, "/k f", [])
    assert how.argv == ("my-server", "--port", "5000", "--model", hostile, "--key-file", "/k f")
    assert how.key_env == ("ORCHESTRA_SERVER_KEY",)


def test_llama_cpp_argv_runs_the_xllamacpp_launcher(tmp_path: Path) -> None:
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    spec = parse_server(dict(engine="llama.cpp", model=str(gguf), threads=3, parallel=2, args=["n_batch=64"]))
    how = launch(spec, "smol", 7000, "/k", [])
    assert how.argv[1:3] == ("-m", "orchestra.serving.xllama")
    assert ("--threads", "3") == how.argv[how.argv.index("--threads"):how.argv.index("--threads") + 2]
    assert how.argv[-2:] == ("--set", "n_batch=64")
    assert spec.gpus_per_replica == 0 and not spec.supports_loglik


def test_replicas_and_threads_do_not_change_what_a_served_model_answers(tmp_path: Path) -> None:
    from orchestra.models.openai_api import OpenAIAPI

    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    base = dict(abbr="m", path="smol", server=dict(engine="llama.cpp", model=str(gguf), replicas=1, threads=1))
    faster = {**base, "server": {**base["server"], "replicas": 4, "threads": 2, "max_restarts": 9}}
    other = {**base, "server": {**base["server"], "args": ["top_k=5"]}}
    assert OpenAIAPI.identity(base) == OpenAIAPI.identity(faster)
    assert OpenAIAPI.identity(base) != OpenAIAPI.identity(other)


def test_launch_with_key_gives_the_module_its_key_flag_without_putting_the_key_in_argv(tmp_path: Path) -> None:
    """SGLang takes its key only as --api-key: the shim adds it inside the process."""
    import json
    import os
    import subprocess

    (tmp_path / "fake_server.py").write_text(
        "import json, sys\n"
        "cmdline = open('/proc/self/cmdline', 'rb').read().split(b'\\0')\n"
        "print(json.dumps({'argv': sys.argv, 'cmdline': [a.decode() for a in cmdline if a]}))\n")
    key_file = tmp_path / "k.key"
    key_file.write_text("s3cret-key-value\n")
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{Path(__file__).resolve().parents[2]}",
           KEY_FILE_ENV: str(key_file)}
    out = subprocess.run([sys.executable, "-m", "orchestra.serving.launch_with_key", "--api-key", "fake_server",
                          "--port", "9"], env=env, capture_output=True, text=True, timeout=60, check=True).stdout
    seen = json.loads(out)
    assert seen["argv"][1:] == ["--port", "9", "--api-key", "s3cret-key-value"]
    assert not any("s3cret" in a for a in seen["cmdline"])


def test_llama_cpp_args_that_would_override_orchestras_own_settings_are_refused_at_config_time(
        tmp_path: Path) -> None:
    """``args`` of llama.cpp are ``name=value`` settings; the port, the listening address, the key,
    the weights and the alias are orchestra's (before: accepted, and the replica listened elsewhere
    or on every address, found only at its startup timeout)."""
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    for arg, expected in [("port=8080", "orchestra sets port itself"),
                          ("hostnames=0.0.0.0", "orchestra sets hostnames"),
                          ("api_keys=x", "orchestra sets api_keys"), ("--n-predict", "expected name=value"),
                          ("n predict=3", "expected name=value")]:
        with pytest.raises(ConfigError) as err:
            parse_server(dict(engine="llama.cpp", model=str(gguf), args=[arg]))
        assert f"server.args: {arg!r}: {expected}" in str(err.value) and "\n" not in str(err.value)
    assert parse_server(dict(engine="llama.cpp", model=str(gguf), args="n_batch=64 warmup=false")).args == (
        "n_batch=64", "warmup=false")


def test_each_llama_cpp_setting_is_read_as_its_fields_type_or_refused_in_one_line() -> None:
    """The launcher's ``--set`` on xllamacpp's real ``CommonParams``: a misspelt flag was read as
    ``false`` and a non-number or an object field ended in a traceback; now one line each."""
    import xllamacpp

    from orchestra.serving.xllama import _apply

    params = xllamacpp.CommonParams()
    for setting in ("n_predict=7", "warmup=off", "verbose_prompt=yes", "n_batch=64", "rope_freq_scale=0.5",
                    "chat_template=chatml"):
        _apply(params, setting)
    assert (params.n_predict, params.warmup, params.verbose_prompt, params.n_batch) == (7, False, True, 64)
    assert (params.rope_freq_scale, params.chat_template) == (0.5, "chatml")
    for setting, expected in [("verbose_prompt=maybe", "not a value for verbose_prompt: expected one of"),
                              ("n_predict=lots", "not a value for n_predict"),
                              ("sampling=greedy", "not a value for sampling: the field holds a CommonParamsSampling"),
                              ("port=1", "orchestra sets port itself"), ("no_such_field=1", "expected name=value"),
                              ("n_predict", "expected name=value")]:
        with pytest.raises(SystemExit) as err:
            _apply(params, setting)
        assert str(err.value).startswith(f"xllama: --set {setting!r}: ") and expected in str(err.value), err.value
    assert params.n_predict == 7 and params.verbose_prompt is True


def test_each_key_of_a_wrong_type_is_refused_in_one_line_naming_it(tmp_path: Path) -> None:
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    cases = [
        (["engine='command'"], "server must be a dict with engine=..., model=..."),
        (dict(engine="vllm", model=""), "server.model must name the weights"),
        (dict(engine="vllm", model=7), "server.model must name the weights"),
        (dict(engine="vllm", model="org/name", args=[1, 2]), "server.args must be a list of strings"),
        (dict(engine="command", model="m", command=[]), "server.command must be a non-empty argv template"),
        (dict(engine="command", model="m", command=["srv", "{port"]), "server.command: argument '{port'"),
        (dict(engine="vllm", model="org/name", env={"A": 1}), "server.env must be a dict of strings"),
        (dict(engine="vllm", model="org/name", startup_timeout_s=-1), "server.startup_timeout_s must be a number"),
        (dict(engine="vllm", model="org/name", startup_timeout_s=True), "server.startup_timeout_s must be a number"),
        (dict(engine="vllm", model="org/name", executable=""), "server.executable must be a command name or path"),
        (dict(engine="llama.cpp", model=str(gguf), python=["py"]), "server.python must be a command name or path"),
        (dict(engine="vllm", model="org/name", tensor_parallel_size=True), "must be an integer >= 1, got True"),
    ]
    for cfg, expected in cases:
        with pytest.raises(ConfigError) as err:
            parse_server(cfg)
        assert expected in str(err.value) and "\n" not in str(err.value), (cfg, str(err.value))


def test_string_args_and_command_are_split_like_a_shell_and_a_spec_is_never_taken_unchecked(tmp_path: Path) -> None:
    spec = parse_server(dict(engine="command", model="m", command="srv --port {port} --name '{name} x'",
                             args="--flag 'a b'"))
    assert spec.command == ("srv", "--port", "{port}", "--name", "{name} x") and spec.args == ("--flag", "a b")
    assert launch(spec, "smol", 7001, "/k", []).argv == ("srv", "--port", "7001", "--name", "smol x", "--flag", "a b")
    with pytest.raises(ConfigError, match="server must be a dict"):
        parse_server(spec)  # a ServerSpec built by hand skips every check: refused like any non-dict


def test_the_llama_cpp_launcher_never_serves_without_a_key_or_its_weights(tmp_path: Path) -> None:
    """No key file, an empty one, a model file gone since the config was checked: one line each."""
    import os
    import subprocess

    empty = tmp_path / "empty.key"
    empty.write_text("\n")
    key = tmp_path / "k.key"
    key.write_text("k" * 20)
    argv = [sys.executable, "-m", "orchestra.serving.xllama", "--model", str(tmp_path / "gone.gguf"), "--port", "9",
            "--alias", "m"]
    for key_file, code, expected in [(None, 1, "xllama: no key file ("), (empty, 1, "xllama: the key file is empty"),
                                     (key, 3, "xllama: model file not found: ")]:
        env = {k: v for k, v in os.environ.items() if k != KEY_FILE_ENV}
        env.update({KEY_FILE_ENV: str(key_file)} if key_file else {})
        res = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)
        assert res.returncode == code and res.stderr.startswith(expected), res.stderr
        assert len(res.stderr.strip().splitlines()) == 1
