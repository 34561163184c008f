"""A TCP relay that delays each direction by D ms: a network between `--rpc` and its workers, on one machine.

    python scripts/rpc_latency_proxy.py --delay-ms 5 127.0.0.1:6001=127.0.0.1:5001 127.0.0.1:6002=127.0.0.1:5002

Each LISTEN=TARGET pair forwards connections made to LISTEN on to TARGET. Every chunk
read from either side is written to the other side D ms after it arrived (a link with
latency D and no bandwidth limit: chunks keep their order, delays do not add up).
Benchmarks only: for a real network, point `--rpc` at the workers themselves.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import time


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float) -> None:
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def deliver() -> None:
        while True:
            arrived, data = await queue.get()
            if not data:
                break
            wait = arrived + delay - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            writer.write(data)
            await writer.drain()
        writer.close()

    delivering = asyncio.create_task(deliver())
    with contextlib.suppress(ConnectionError):
        while data := await reader.read(1 << 20):
            queue.put_nowait((time.monotonic(), data))
    queue.put_nowait((time.monotonic(), b""))
    with contextlib.suppress(ConnectionError):
        await delivering


async def _relay(target: tuple[str, int], delay: float, client_reader, client_writer) -> None:
    try:
        server_reader, server_writer = await asyncio.open_connection(*target)
    except OSError:
        client_writer.close()
        return
    await asyncio.gather(_pipe(client_reader, server_writer, delay), _pipe(server_reader, client_writer, delay))


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--delay-ms", type=float, required=True, help="one-way delay, each direction")
    parser.add_argument("routes", nargs="+", metavar="LISTEN=TARGET", help="e.g. 127.0.0.1:6001=127.0.0.1:5001")
    args = parser.parse_args()
    servers = []
    for route in args.routes:
        listen, _, target = route.partition("=")
        handler = functools.partial(_relay, _address(target), args.delay_ms / 1000)  # called with (reader, writer)
        servers.append(await asyncio.start_server(handler, *_address(listen)))
    print(f"relaying {', '.join(args.routes)} with {args.delay_ms:g} ms each way", flush=True)
    await asyncio.gather(*(server.serve_forever() for server in servers))


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main())
