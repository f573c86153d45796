"""A real `edgespec serve` process on 127.0.0.1 for the hostile-input tests (tests/test_hostile_serve.py,
tests/test_fuzz_input.py): started as a user would, its log kept in a file to count lines in."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

START_TIMEOUT = 120.0  # seconds: the bundled pair loads in a few; the tiny GGUF in well under one


class Served:
    def __init__(self, argv: list[str], home: Path, own_home: bool = True, env: dict[str, str] | None = None):
        """``home``: where the log goes, and (``own_home``) the server's EDGESPEC_HOME; without it the
        server uses the installed models (the bundled pair)."""
        self.log_path = home / "serve.log"
        self.log = open(self.log_path, "w+", encoding="utf-8")  # closed in stop()
        environment = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        if own_home:
            environment["EDGESPEC_HOME"] = str(home)
        environment.pop("EDGESPEC_API_KEY", None)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "edgespec", "serve", "--port", "0", *argv],
            env={**environment, **(env or {})},
            stdout=subprocess.DEVNULL,
            stderr=self.log,
            text=True,
        )
        self.url = self._wait_for_url()
        self.port = int(self.url.rsplit(":", 1)[1].split("/")[0])

    def _wait_for_url(self) -> str:
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            for line in self.log_path.read_text(encoding="utf-8").splitlines():
                if "serving" in line and " on http" in line:  # "edgespec: serving <pair> (chain) on URL/v1"
                    return line.split(" on ")[-1].strip().removesuffix("/v1")
            if self.proc.poll() is not None:
                raise RuntimeError(f"edgespec serve exited: {self.log_path.read_text(encoding='utf-8')}")
            time.sleep(0.05)
        raise RuntimeError("edgespec serve did not start in time")

    def log_text(self) -> str:
        return self.log_path.read_text(encoding="utf-8")

    def raw(self, data: bytes, read: bool = True, timeout: float = 5.0) -> bytes:
        """Send ``data`` on a fresh connection; the reply's bytes (until the server closes or the timeout)."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=timeout) as sock:
            sock.sendall(data)
            if not read:
                return b""
            chunks = []
            try:
                while chunk := sock.recv(65536):
                    chunks.append(chunk)
            except (TimeoutError, ConnectionResetError):
                pass
            return b"".join(chunks)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self.log.close()
