"""The server's listening socket: the connections it accepts send small writes at once (TCP_NODELAY).

uvicorn serves on the socket `transport.listen` made, through asyncio, which turns Nagle's algorithm
off only for sockets whose protocol says TCP. With Nagle on, a response's body, written after its
headers, waited for the client's delayed ACK: 40 ms on every answer that is not streamed.
"""

from __future__ import annotations

import asyncio
import socket

import pytest

from specgguf.errors import UsageError
from specgguf.serve.transport import listen


def _accepted_nodelay(host: str) -> int:
    """TCP_NODELAY on the server's side of one connection, accepted as uvicorn accepts it."""
    server_socket = listen(host, 0)
    port = server_socket.getsockname()[1]

    async def main() -> int:
        accepted: asyncio.Future[int] = asyncio.get_running_loop().create_future()

        class Probe(asyncio.Protocol):
            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                sock = transport.get_extra_info("socket")
                accepted.set_result(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
                transport.close()

        server = await asyncio.get_running_loop().create_server(Probe, sock=server_socket)
        async with server:
            _, writer = await asyncio.open_connection(host, port)
            try:
                return await asyncio.wait_for(accepted, 10)
            finally:
                writer.close()

    return asyncio.run(main())


def test_a_connection_to_the_server_has_nagles_algorithm_off():
    assert _accepted_nodelay("127.0.0.1") != 0


def test_on_ipv6_too():
    try:
        socket.create_server(("::1", 0), family=socket.AF_INET6).close()
    except OSError:
        pytest.skip("no IPv6 loopback here")
    assert _accepted_nodelay("::1") != 0


def test_the_socket_is_tcp_and_a_taken_port_is_one_clear_error():
    taken = listen("127.0.0.1", 0)
    try:
        assert taken.proto == socket.IPPROTO_TCP and taken.type == socket.SOCK_STREAM
        with pytest.raises(UsageError, match="cannot listen on 127.0.0.1:"):
            listen("127.0.0.1", taken.getsockname()[1])
    finally:
        taken.close()
