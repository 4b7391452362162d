"""Units of the node agent (orchestra/serving/agent.py): its spec travels whole, it binds
127.0.0.1 when the orchestrator is on its machine, and the listener lookup follows the address."""

from __future__ import annotations

import socket

from orchestra.serving.agent import node_address, spec_from_json, spec_json
from orchestra.serving.replica import listener
from orchestra.serving.spec import ServerSpec


def test_a_spec_survives_its_trip_through_json() -> None:
    import json

    spec = ServerSpec("command", "m", replicas=2, gpus=1, args=("--x", "1"), command=("srv", "{port}"),
                      env=(("A", "b"),), startup_timeout_s=5.0)
    assert spec_from_json(json.loads(json.dumps(spec_json(spec)))) == spec


def test_the_orchestrators_own_machine_means_loopback() -> None:
    assert node_address(socket.gethostname()) == "127.0.0.1"
    assert node_address("") == "127.0.0.1"


def test_listener_finds_a_socket_on_the_address_it_is_asked_about() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        found = listener(port, "127.0.0.1")
        assert found is not None and found[1] is False
        assert listener(port, "127.0.0.2") is None  # another address: not this socket
