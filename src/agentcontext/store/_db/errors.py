"""What goes wrong with a database and what it is called: lost connections, and the driver's
worker threads that must end before a failing command line exits."""

from __future__ import annotations

import asyncio
import threading

from agentcontext._drivers import is_connection_error

__all__ = ["driver_threads", "is_connection_error", "settle_driver_threads"]


def _driver_threads() -> list[threading.Thread]:
    return [
        thread
        for thread in threading.enumerate()
        if getattr(getattr(thread, "_target", None), "__name__", "") == "_connection_worker_thread"
    ]


def driver_threads() -> set[threading.Thread]:
    """aiosqlite's worker threads alive now."""
    return set(_driver_threads())


async def settle_driver_threads(
    *, keep_alive: bool = False, since: set[threading.Thread] | None = None, within: float = 2.0
) -> None:
    """Let aiosqlite's worker threads that are stopping finish while the loop still runs.

    aiosqlite stops the thread of a connection that failed to open (or was closed) without
    waiting for it; the thread then reports to the event loop, and if that loop has closed
    meanwhile (a command line exiting on the error) it prints a traceback. With
    ``keep_alive``, wait until one of the threads alive now has ended (the one stopping);
    otherwise until every thread started after ``since`` (a `driver_threads` snapshot) has.
    At most ``within`` seconds.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    threads = [t for t in _driver_threads() if since is None or t not in since]
    while threads and loop.time() < deadline:
        alive = [thread for thread in threads if thread.is_alive()]
        if (keep_alive and len(alive) < len(threads)) or (not keep_alive and not alive):
            break
        await asyncio.sleep(0.005)
    await asyncio.sleep(0)  # run the callbacks the threads posted
