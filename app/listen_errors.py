"""One wording for a listener that cannot bind: `<listener> cannot bind HOST:PORT: <reason>`.

`stepwatch serve` turns that OSError into its one-line exit 2, whichever port is taken."""

from __future__ import annotations


def bind_error(exc: OSError, listener: str, host: str, port: int) -> OSError:
    """The OSError aiohttp/asyncio raised on bind, reworded; asyncio's text is "error while
    attempting to bind on address (addr): why", of which only "why" is kept."""
    reason = (exc.strerror or str(exc)).rsplit(": ", 1)[-1]
    return OSError(exc.errno, f"{listener} cannot bind {host}:{port}: {reason}")
