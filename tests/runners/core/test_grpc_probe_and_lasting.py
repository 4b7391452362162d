"""Two small pieces of runners/core that RayRunner uses and nothing in them is Ray's: the gRPC probe
of an address (real sockets here: a server answering as HTTP/2 does, an HTTP/1 one, a silent one,
none) and the thread that outlives a stage's thread."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from orchestra.runners.core.grpc_probe import PREFACE, why_not_grpc
from orchestra.runners.core.lasting import in_lasting_thread

SETTINGS = bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])  # an empty SETTINGS frame on stream 0


@contextmanager
def server(answer: Callable[[socket.socket], None]) -> Iterator[int]:
    """A TCP server on 127.0.0.1 that lets ``answer`` handle each connection; its port."""
    listener = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            held.append(conn)
            answer(conn)

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield listener.getsockname()[1]
    finally:
        listener.close()
        for conn in held:
            conn.close()


def as_grpc(conn: socket.socket) -> None:
    got = b""
    while len(got) < len(PREFACE):
        got += conn.recv(len(PREFACE) - len(got))
    conn.sendall(SETTINGS if got == PREFACE else b"")


def hang_up(conn: socket.socket) -> None:
    conn.recv(100)  # all of it: a close with data unread would be a reset
    conn.close()


def as_http1(conn: socket.socket) -> None:
    conn.recv(100)
    conn.sendall(b"HTTP/1.0 400 Bad Request\r\n\r\n")


def test_a_server_that_answers_the_preface_with_settings_is_grpc() -> None:
    with server(as_grpc) as port:
        assert why_not_grpc("127.0.0.1", port, "a gRPC port") is None


@pytest.mark.parametrize("answer, said", [
    (as_http1, "an HTTP/1 server (hint) listens there, not the GCS port"),
    (hang_up, "a server that closed the connection without a word listens there, not the GCS port"),
    (lambda conn: conn.sendall(b"SSH-2.0-OpenSSH\r\n"), "a server that does not speak HTTP/2 listens there, not the "
                                                        "GCS port"),
    (lambda conn: None, "what listens there said nothing within 0.3 s; expected the GCS port"),
])
def test_what_else_listens_is_named_with_what_was_expected(answer: Callable[[socket.socket], None], said: str) -> None:
    with server(answer) as port:
        assert why_not_grpc("127.0.0.1", port, "the GCS port", answer_timeout_s=0.3, http1="an HTTP/1 server (hint)") \
            == said
        assert why_not_grpc("127.0.0.1", port, "the GCS port", tls=True) is None  # TLS: the connection is enough


def test_nothing_listening_is_the_connection_error() -> None:
    with socket.create_server(("127.0.0.1", 0)) as probe:
        port = probe.getsockname()[1]
    assert why_not_grpc("127.0.0.1", port, "x") == "Connection refused"


def test_the_lasting_thread_outlives_its_callers_and_hands_back_results_and_errors() -> None:
    seen: list[threading.Thread] = []

    def from_a_short_thread() -> None:
        seen.append(in_lasting_thread(threading.current_thread))

    caller = threading.Thread(target=from_a_short_thread)
    caller.start()
    caller.join()
    lasting = seen[0]
    assert lasting is not caller and lasting.daemon and lasting.is_alive()  # its caller ended, it did not
    assert in_lasting_thread(threading.current_thread) is lasting  # one thread for the process
    with pytest.raises(ValueError, match="no"):
        in_lasting_thread(lambda: int("no"))
    assert in_lasting_thread(lambda: 7) == 7  # an error does not end it
