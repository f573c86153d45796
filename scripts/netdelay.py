"""A TCP proxy that adds a fixed delay in each direction: a slower network between this machine and an
RPC server, on one machine (this kernel has no netem; ``tc qdisc … netem`` fails).

Every chunk read from one side is written to the other ``delay`` seconds after it arrived, in order,
while reading goes on: the link gains latency, not a bandwidth limit. ``TCP_NODELAY`` is set on both
sockets, as llama.cpp's RPC client and server set it on theirs.

    python scripts/netdelay.py --listen 127.0.0.1:60052 --to 127.0.0.1:50052 --delay-ms 5
    edgespec generate "…" --rpc 127.0.0.1:60052          # the server, 5 ms further away each way

In a program (a benchmark, a test): ``with DelayProxy(("127.0.0.1", 50052), 0.005) as proxy:`` and
connect to ``proxy.port``. A development tool (the standard library only): not part of the package.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import socket
import threading


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float) -> None:
    """One direction: each chunk written ``delay`` s after it was read; the end of the stream too."""
    loop = asyncio.get_running_loop()
    chunks: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def send() -> None:
        while True:
            due, data = await chunks.get()
            wait = due - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            if not data:
                if writer.can_write_eof():
                    writer.write_eof()
                return
            writer.write(data)
            await writer.drain()

    sender = asyncio.create_task(send())
    try:
        while data := await reader.read(1 << 16):
            chunks.put_nowait((loop.time() + delay, data))
    except ConnectionError:
        pass
    chunks.put_nowait((loop.time() + delay, b""))
    with contextlib.suppress(ConnectionError):
        await sender


def _no_delay(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


async def _relay(
    client_reader: asyncio.StreamReader,
    client_writer: asyncio.StreamWriter,
    upstream: tuple[str, int],
    delay: float,
    open_writers: set[asyncio.StreamWriter],
) -> None:
    try:
        server_reader, server_writer = await asyncio.open_connection(*upstream)
    except OSError:
        client_writer.close()
        return
    writers = (client_writer, server_writer)
    open_writers.update(writers)
    for writer in writers:
        _no_delay(writer)
    try:
        await asyncio.gather(
            _pump(client_reader, server_writer, delay), _pump(server_reader, client_writer, delay)
        )
    finally:
        open_writers.difference_update(writers)
        for writer in writers:
            writer.close()


async def start_proxy(
    listen: tuple[str, int],
    upstream: tuple[str, int],
    delay: float,
    open_writers: set[asyncio.StreamWriter] | None = None,
) -> asyncio.Server:
    """Listen on ``listen`` (port 0: a free one) and relay every connection to ``upstream``; the
    connections' writers are kept in ``open_writers`` while they are open."""
    writers = set() if open_writers is None else open_writers
    return await asyncio.start_server(lambda r, w: _relay(r, w, upstream, delay, writers), *listen)


class DelayProxy:
    """The proxy on its own thread and event loop, for as long as the ``with`` block runs."""

    def __init__(self, upstream: tuple[str, int], delay: float, listen: tuple[str, int] = ("127.0.0.1", 0)):
        self.upstream, self.delay, self.listen = upstream, delay, listen
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="netdelay", daemon=True)
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    def __enter__(self) -> DelayProxy:
        self._thread.start()
        future = asyncio.run_coroutine_threadsafe(
            start_proxy(self.listen, self.upstream, self.delay, self._writers), self._loop
        )
        self._server = future.result(10)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def __exit__(self, *exc) -> None:
        async def stop() -> None:
            # Connections end by closing their sockets, not by cancelling their tasks (Python 3.11's
            # streams log a cancelled connection task as an error): every relay then returns.
            assert self._server is not None
            self._server.close()
            for writer in list(self._writers):
                writer.transport.abort()
            others = asyncio.all_tasks() - {asyncio.current_task()}
            if others:
                await asyncio.wait(others, timeout=5)

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        if not self._thread.is_alive():
            self._loop.close()


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not HOST:PORT")
    return host, int(port)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python scripts/netdelay.py", description=__doc__.split("\n")[0])
    parser.add_argument("--listen", type=_address, required=True, help="HOST:PORT to accept connections on")
    parser.add_argument("--to", type=_address, required=True, help="HOST:PORT to relay them to")
    parser.add_argument("--delay-ms", type=float, required=True, help="added delay per direction")
    args = parser.parse_args(argv)

    async def run() -> None:
        server = await start_proxy(args.listen, args.to, args.delay_ms / 1000)
        async with server:
            await server.serve_forever()

    (host, port), (to_host, to_port) = args.listen, args.to
    print(f"relaying {host}:{port} -> {to_host}:{to_port}, +{args.delay_ms:g} ms each way", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
