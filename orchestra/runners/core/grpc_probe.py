"""Whether a gRPC server answers at an address, known within seconds.

Some clients retry a dead address for minutes, or hang on a server that speaks another protocol
(``ray.init`` at an HTTP port does, for 10+ minutes).  :func:`why_not_grpc` opens a TCP connection
and sends the HTTP/2 connection preface, which every gRPC server answers with a SETTINGS frame.
"""

from __future__ import annotations

import socket

#: the HTTP/2 client connection preface, followed by an empty SETTINGS frame
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])


def why_not_grpc(host: str, port: int, expected: str, *, connect_timeout_s: float = 10.0,
                 answer_timeout_s: float = 3.0, tls: bool = False, http1: str = "an HTTP/1 server") -> str | None:
    """Why no gRPC server answers at ``host:port``, in words for one line, or None if one does.

    Args:
        expected: what should listen there, in words (named when something else answers).
        connect_timeout_s: how long the TCP connection may take (its error is the answer then).
        answer_timeout_s: how long the server may take to answer the preface.
        tls: only the TCP connection is checked (a TLS handshake is the client's to make).
        http1: how an HTTP/1 server is named (with a hint at the usual mistake).
    """
    try:
        conn = socket.create_connection((host, port), timeout=connect_timeout_s)
    except OSError as exc:
        return exc.strerror or str(exc) or type(exc).__name__
    with conn:
        if tls:
            return None
        conn.settimeout(answer_timeout_s)
        head = b""
        try:
            conn.sendall(PREFACE)
            while len(head) < 9:
                chunk = conn.recv(9 - len(head))
                if not chunk:
                    break
                head += chunk
        except TimeoutError:
            return f"what listens there said nothing within {answer_timeout_s:g} s; expected {expected}"
        except OSError as exc:
            return f"the connection failed ({exc.strerror or exc}); expected {expected}"
    if len(head) == 9 and head[3] == 4 and head[5:9] == bytes(4):  # frame type SETTINGS, stream 0
        return None
    if head.startswith((b"HTTP/", b"<")):  # a status line, or an HTTP/0.9-style error page
        seen = http1
    elif not head:
        seen = "a server that closed the connection without a word"
    else:
        seen = "a server that does not speak HTTP/2"
    return f"{seen} listens there, not {expected}"
