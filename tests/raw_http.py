"""A raw HTTP/1.1 client over a socket, for tests of what the server does with a connection
(timeouts, head limits, pipelining) that an HTTP library would hide."""

from __future__ import annotations

import socket

from flaudit.service.http_protocol import MAX_HEAD_BYTES


def connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=30)


def send_all_you_can(sock: socket.socket, data: bytes) -> None:
    """Send ``data``; the server may close before it has all of it."""
    try:
        sock.sendall(data)
    except OSError:  # reset or broken pipe: the server closed
        pass


def read_until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes (what arrived before a reset)."""
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except ConnectionResetError:
        pass
    return data


def exchange(port: int, data: bytes) -> bytes:
    """Send ``data`` (as much as the server takes) on a new connection; read until it closes."""
    with connect(port) as sock:
        send_all_you_can(sock, data)
        return read_until_closed(sock)


def read_response(sock: socket.socket) -> bytes:
    """One response with a Content-Length or a chunked body; b"" if the server closed first."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    if b"transfer-encoding: chunked" in head.lower():
        while not body.endswith(b"0\r\n\r\n"):
            chunk = sock.recv(65536)
            assert chunk, data
            body += chunk
    else:
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        while len(body) < length:
            chunk = sock.recv(65536)
            assert chunk, data
            body += chunk
    return head + b"\r\n\r\n" + body


def assert_431(answer: bytes) -> None:
    """A head-size refusal: 431, the connection closed, the limit named."""
    assert answer.startswith(b"HTTP/1.1 431 "), answer[:200]
    assert b"connection: close" in answer.lower(), answer
    assert b"over the limit of %d bytes" % MAX_HEAD_BYTES in answer, answer
