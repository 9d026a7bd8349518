"""Child processes and ports in the tests: one way to see a port listening and one way to stop."""

from __future__ import annotations

import signal
import socket
import subprocess
from typing import Any


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    """Whether something accepts connections on host:port now."""
    with socket.socket() as sock:
        sock.settimeout(0.2)
        return sock.connect_ex((host, port)) == 0


def terminate(proc: subprocess.Popen[Any] | None, timeout: float = 20.0) -> None:
    """SIGTERM (the process drains), SIGKILL after `timeout`; nothing when it already exited."""
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
