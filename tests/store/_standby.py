"""A streaming standby of the test PostgreSQL server, on loopback, for the read-replica tests.

`start_standby` copies the server with ``pg_basebackup -R`` (a physical replication
connection from 127.0.0.1, which the server's ``pg_hba.conf`` must allow: ``.ci/run`` adds
``host replication postgres 127.0.0.1/32 trust`` and reloads) into a temporary directory and
starts it with ``pg_ctl`` on a free port. The server binaries run as the OS user ``postgres``
when the tests run as root. Nothing of the system's configuration is changed here.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
from pathlib import Path

from sqlalchemy.engine import make_url

__all__ = ["BINARIES", "Standby", "StandbyError", "start_standby"]

BINARIES = Path(os.environ.get("AGENTCONTEXT_PG_BIN", "/usr/lib/postgresql/15/bin"))

# A hot standby needs these at least as high as on the primary: copied from it.
_COPIED = (
    "max_connections",
    "max_worker_processes",
    "max_wal_senders",
    "max_prepared_transactions",
    "max_locks_per_transaction",
)


class StandbyError(Exception):
    """The standby could not be made or started (the message says why)."""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _as_postgres(command: list[str]) -> list[str]:
    if os.geteuid() == 0:
        return ["runuser", "-u", "postgres", "--", *command]
    return command


def _run(command: list[str], timeout: float = 120) -> str:
    done = subprocess.run(
        _as_postgres(command), capture_output=True, text=True, timeout=timeout, check=False
    )
    if done.returncode != 0:
        raise StandbyError(
            f"{Path(command[0]).name} failed ({done.returncode}): "
            f"{(done.stderr or done.stdout).strip()[-1500:]}"
        )
    return done.stdout


class Standby:
    """A running standby: its URLs, and stop/start for the tests that take it down."""

    def __init__(self, work: Path, port: int, primary_url: str) -> None:
        self.work = work
        self.data = work / "data"
        self.port = port
        self.log = work / "standby.log"
        self._primary = make_url(primary_url)

    def url(self, database: str) -> str:
        """The asyncpg URL of ``database`` on the standby."""
        return (
            self._primary.set(host="127.0.0.1", port=self.port, database=database)
            .render_as_string(hide_password=False)
        )  # fmt: skip

    def start(self) -> None:
        _run(
            [
                str(BINARIES / "pg_ctl"), "start", "-w", "-t", "60", "-D", str(self.data),
                "-l", str(self.log),
            ]
        )  # fmt: skip

    def stop(self) -> None:
        _run(
            [str(BINARIES / "pg_ctl"), "stop", "-w", "-t", "60", "-m", "fast", "-D", str(self.data)]
        )

    def _processes(self) -> list[int]:
        """The postmaster's process id and every process below it."""
        pid = int((self.data / "postmaster.pid").read_text().split()[0])
        found, todo = [], [pid]
        while todo:
            current = todo.pop()
            found.append(current)
            children = subprocess.run(
                ["pgrep", "-P", str(current)], capture_output=True, text=True, check=False
            ).stdout.split()
            todo.extend(int(child) for child in children)
        return found

    def freeze(self) -> None:
        """Stop every process of the server (SIGSTOP): it accepts TCP connections and reads
        nothing, like a hung host or a paused virtual machine."""
        for pid in self._processes():
            os.kill(pid, signal.SIGSTOP)

    def thaw(self) -> None:
        """Let a frozen server run again (SIGCONT)."""
        for pid in self._processes():
            os.kill(pid, signal.SIGCONT)

    @property
    def running(self) -> bool:
        done = subprocess.run(
            _as_postgres([str(BINARIES / "pg_ctl"), "status", "-D", str(self.data)]),
            capture_output=True,
            check=False,
        )
        return done.returncode == 0

    def remove(self) -> None:
        if self.running:
            try:
                self.stop()
            except StandbyError:
                _run([str(BINARIES / "pg_ctl"), "stop", "-m", "immediate", "-D", str(self.data)])
        shutil.rmtree(self.work, ignore_errors=True)

    def log_tail(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-2000:]
        except OSError:
            return ""


def start_standby(primary_url: str, settings: dict[str, str]) -> Standby:
    """Copy the primary at ``primary_url`` and start it as a hot standby on a free port.

    ``settings`` are the primary's values of the settings a standby must match (`_COPIED`).
    """
    for name in ("pg_basebackup", "pg_ctl", "postgres"):
        if not (BINARIES / name).exists():
            raise StandbyError(f"{BINARIES / name} is missing (PostgreSQL server binaries)")
    primary = make_url(primary_url)
    # Not under pytest's tmp dir: the server runs as another user and needs its own dir.
    work = Path(tempfile.mkdtemp(prefix="agentcontext-standby-"))
    work.chmod(0o755)
    if os.geteuid() == 0:
        shutil.chown(work, "postgres", "postgres")
    port = _free_port()
    standby = Standby(work, port, primary_url)
    try:
        _run(
            [
                str(BINARIES / "pg_basebackup"), "-h", primary.host or "127.0.0.1",
                "-p", str(primary.port or 5432), "-U", primary.username or "postgres",
                "-D", str(standby.data), "-X", "stream", "-R", "-c", "fast", "--no-sync",
            ]
        )  # fmt: skip
        lines = [
            f"port = {port}",
            "listen_addresses = '127.0.0.1'",
            f"unix_socket_directories = '{work}'",
            "hot_standby = on",
            "hot_standby_feedback = on",
            "wal_receiver_status_interval = 1s",
            "shared_buffers = 16MB",
            "fsync = off",
            *(f"{name} = {settings[name]}" for name in _COPIED if name in settings),
        ]
        config = standby.data / "postgresql.conf"
        config.write_text("\n".join(lines) + "\n")
        (standby.data / "pg_hba.conf").write_text(
            "local all all trust\nhost all all 127.0.0.1/32 trust\n"
        )
        (standby.data / "pg_ident.conf").write_text("")
        if os.geteuid() == 0:
            for path in (config, standby.data / "pg_hba.conf", standby.data / "pg_ident.conf"):
                shutil.chown(path, "postgres", "postgres")
        standby.start()
    except (StandbyError, OSError, subprocess.TimeoutExpired) as exc:
        tail = standby.log_tail()
        shutil.rmtree(work, ignore_errors=True)
        raise StandbyError(f"{exc}{' — log: ' + tail if tail else ''}") from exc
    return standby


COPIED_SETTINGS = _COPIED
