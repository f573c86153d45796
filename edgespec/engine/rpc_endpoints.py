"""The RPC servers' addresses and llama.cpp's RPC handshake, checked from Python before llama.cpp
connects (its client aborts the process on a failed connect or handshake, and has no timeouts)."""

from __future__ import annotations

import socket
import struct

from ..errors import EngineError

PROTOCOL = (7, 0)  # RPC_PROTO_MAJOR/MINOR_VERSION of the vendored ggml-rpc.h
DEFAULT_PORT = 50052
CHECK_TIMEOUT = 5.0  # seconds for a server's TCP connect and HELLO before llama.cpp connects
_HELLO, _CAPS = 14, 24  # RPC_CMD_HELLO; RPC_CONN_CAPS_SIZE (transport.h): rpc_msg_hello_req's size


def parse_endpoints(text: str | tuple[str, ...]) -> tuple[str, ...]:
    """``HOST:PORT[,HOST:PORT…]`` (or its parts) checked: an IPv4 address or a host name, a port."""
    parts = text.split(",") if isinstance(text, str) else text
    endpoints = tuple(p.strip() for p in parts if p.strip())
    for endpoint in endpoints:
        host, _, port = endpoint.rpartition(":")
        if not host or ":" in host or not port.isdigit() or not 0 < int(port) < 65536:
            raise EngineError(
                f"RPC server {endpoint!r} is not HOST:PORT (e.g. 192.168.1.20:{DEFAULT_PORT}; IPv4 or a "
                "host name, no IPv6: llama.cpp's RPC client speaks IPv4 only)."
            )
    if not endpoints:
        raise EngineError(f"no RPC server given: write --rpc HOST:PORT[,HOST:PORT…] (port {DEFAULT_PORT}).")
    if len(set(endpoints)) != len(endpoints):
        raise EngineError(f"an RPC server is named twice in {','.join(endpoints)}: name each once.")
    return endpoints


def check_server(endpoint: str, timeout: float = CHECK_TIMEOUT) -> tuple[int, int, int]:
    """The server's protocol version, from a TCP connect and the HELLO handshake llama.cpp would do;
    an ``EngineError`` that says what to do when it cannot be reached or speaks another version."""
    host, _, port = endpoint.rpartition(":")
    hello = struct.pack("<BQ", _HELLO, _CAPS) + bytes(_CAPS)  # cmd, request size, no transport caps
    try:
        with socket.create_connection((host, int(port)), timeout=timeout) as sock:
            sock.sendall(hello)
            reply = _receive(sock, 8 + 4 + _CAPS)
    except TimeoutError:
        raise EngineError(
            f"the RPC server {endpoint} accepted the connection but did not answer within {timeout:g} s: "
            "it serves one client at a time, so another edgespec or llama.cpp may be using it. Stop that "
            "client or start another `edgespec rpc-server`."
        ) from None
    except OSError as exc:
        raise EngineError(
            f"cannot reach the RPC server {endpoint} ({exc.strerror or exc}). Start it there with "
            f"`edgespec rpc-server --host ADDRESS --port {port}`, and check the address and any firewall."
        ) from None
    size = struct.unpack_from("<Q", reply)[0] if len(reply) >= 8 else None
    if size != 4 + _CAPS or len(reply) < 12:
        raise EngineError(
            f"the RPC server {endpoint} closed the handshake: it speaks another version of llama.cpp's RPC "
            f"protocol than this edgespec ({PROTOCOL[0]}.{PROTOCOL[1]}). Run the same edgespec (or a "
            "llama.cpp of the same protocol) on both machines."
        )
    major, minor, patch = reply[8:11]
    if major != PROTOCOL[0] or minor > PROTOCOL[1]:
        raise EngineError(
            f"the RPC server {endpoint} speaks protocol {major}.{minor}.{patch}, this edgespec "
            f"{PROTOCOL[0]}.{PROTOCOL[1]}: run the same edgespec (or llama.cpp version) on both machines."
        )
    return major, minor, patch


def _receive(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            break
        data += chunk
    return data


def refusing(endpoints: tuple[str, ...], timeout: float = 1.0) -> list[str]:
    """The endpoints that no longer accept connections (a server still serving us accepts into its
    backlog): which server was lost, as far as can be told."""
    lost = []
    for endpoint in endpoints:
        host, _, port = endpoint.rpartition(":")
        try:
            socket.create_connection((host, int(port)), timeout=timeout).close()
        except OSError:
            lost.append(endpoint)
    return lost
