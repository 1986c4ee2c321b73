"""A MariaDB primary and its replica, on loopback, for the read-replica tests.

The test server of the suite runs without a binary log, so these are two servers of their own:
one data directory made by ``mariadb-install-db`` and copied, the primary started with a
binary log (GTIDs in domain 0), the replica with ``CHANGE MASTER TO ... MASTER_USE_GTID``.
Both run as the OS user ``mysql`` when the tests run as root, on free ports, and are removed
with their directories at the end. Nothing of the system's configuration is changed.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

__all__ = ["BINARIES", "PairError", "Server", "ServerPair", "start_pair", "start_server"]

BINARIES = Path(os.environ.get("AGENTCONTEXT_MARIADB_BIN", "/usr/sbin"))
_INSTALL = shutil.which("mariadb-install-db") or "/usr/bin/mariadb-install-db"
_CLIENT = shutil.which("mariadb") or "/usr/bin/mariadb"


class PairError(Exception):
    """The servers could not be made or started (the message says why)."""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Server:
    """One server of the pair: its data directory, port and process."""

    def __init__(
        self, work: Path, name: str, server_id: int, *, binlog: bool, packet: str = "64M"
    ) -> None:
        self.packet = packet
        """Its ``max_allowed_packet``."""
        self.data = work / name
        self.socket = work / f"{name}.sock"
        self.log = work / f"{name}.err"
        self.port = _free_port()
        self.server_id = server_id
        self.binlog = binlog
        self.process: subprocess.Popen[bytes] | None = None

    def url(self, database: str) -> str:
        """The asyncmy URL of ``database`` on this server (root over TCP)."""
        return f"mysql+asyncmy://root@127.0.0.1:{self.port}/{database}"

    def sql(self, statement: str) -> str:
        """Run ``statement`` as root over the socket; its output, tab-separated."""
        done = subprocess.run(
            [_CLIENT, "-uroot", f"--socket={self.socket}", "-N", "-B", "-e", statement],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if done.returncode != 0:
            raise PairError(f"{statement!r} failed: {done.stderr.strip()}")
        return done.stdout.strip()

    def start(self) -> None:
        command = [
            str(BINARIES / "mariadbd"), "--no-defaults", f"--datadir={self.data}",
            f"--port={self.port}", "--bind-address=127.0.0.1", f"--socket={self.socket}",
            f"--pid-file={self.data}.pid", f"--log-error={self.log}",
            f"--server-id={self.server_id}", "--skip-name-resolve",
            "--innodb-buffer-pool-size=32M", f"--max-allowed-packet={self.packet}",
            "--innodb-flush-log-at-trx-commit=0", "--sync-binlog=0",
        ]  # fmt: skip
        if self.binlog:
            command.append(f"--log-bin={self.data}/binlog")
        if os.geteuid() == 0:
            command.append("--user=mysql")
        self.process = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                self.sql("SELECT 1")
                return
            except PairError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise PairError(f"mariadbd did not start: {self.log_tail()}") from None
                time.sleep(0.05)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def freeze(self) -> None:
        """SIGSTOP: it accepts connections and answers nothing (a hung host)."""
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGSTOP)

    def thaw(self) -> None:
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGCONT)

    def log_tail(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-2000:]
        except OSError:
            return ""


class ServerPair:
    """A primary and its replica; `remove` stops both and deletes their directories."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.primary = Server(work, "primary", 1, binlog=True)
        self.replica = Server(work, "replica", 2, binlog=False)

    def pause(self) -> None:
        """Stop applying on the replica: from now on it is behind every new commit."""
        self.replica.sql("STOP SLAVE SQL_THREAD")

    def resume(self) -> None:
        self.replica.sql("START SLAVE SQL_THREAD")

    def caught_up(self, within: float = 60.0) -> None:
        """Wait until the replica has applied everything the primary committed so far."""
        position = self.primary.sql("SELECT @@gtid_binlog_pos")
        found = self.replica.sql(f"SELECT MASTER_GTID_WAIT('{position}', {within})")
        if found != "0":
            raise AssertionError(f"the replica did not reach {position} in {within} s")

    def remove(self) -> None:
        for server in (self.replica, self.primary):
            if server.process is not None and server.process.poll() is None:
                server.thaw()
            server.stop()
        shutil.rmtree(self.work, ignore_errors=True)


def _work() -> Path:
    for path in (BINARIES / "mariadbd", Path(_INSTALL), Path(_CLIENT)):
        if not path.exists():
            raise PairError(f"{path} is missing (MariaDB server and client binaries)")
    work = Path(tempfile.mkdtemp(prefix="agentcontext-mariadb-"))
    work.chmod(0o755)
    if os.geteuid() == 0:
        shutil.chown(work, "mysql", "mysql")  # the servers run as mysql and write here
    return work


def _install(data: Path) -> None:
    install = [
        _INSTALL, "--no-defaults", f"--datadir={data}",
        "--auth-root-authentication-method=normal", "--skip-test-db",
    ]  # fmt: skip
    if os.geteuid() == 0:
        install.append("--user=mysql")
    done = subprocess.run(install, capture_output=True, text=True, timeout=120, check=False)
    if done.returncode != 0:
        raise PairError(f"mariadb-install-db failed: {(done.stderr or done.stdout)[-1500:]}")


def start_server(packet: str) -> Server:
    """Make and start one server of its own whose ``max_allowed_packet`` is ``packet`` (a
    setting a test needs, which changing on the shared server would impose on every test
    running meanwhile); `Server.stop` it and remove its ``data.parent`` at the end."""
    work = _work()
    server = Server(work, "alone", 1, binlog=False, packet=packet)
    try:
        _install(server.data)
        server.start()
        server.sql(
            "CREATE USER IF NOT EXISTS 'root'@'127.0.0.1'; "
            "GRANT ALL ON *.* TO 'root'@'127.0.0.1' WITH GRANT OPTION"
        )
    except (PairError, OSError, subprocess.TimeoutExpired) as exc:
        tail = server.log_tail()
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
        raise PairError(f"{exc} — {tail}") from exc
    return server


def start_pair() -> ServerPair:
    """Make and start a primary with a binary log and a replica of it."""
    work = _work()
    pair = ServerPair(work)
    try:
        _install(pair.primary.data)
        shutil.copytree(pair.primary.data, pair.replica.data, symlinks=True)
        if os.geteuid() == 0:
            for root, dirs, files in os.walk(work):
                for name in (*dirs, *files):
                    shutil.chown(Path(root) / name, "mysql", "mysql")
        for server in (pair.primary, pair.replica):
            server.start()
            # root over TCP (no name resolution: 127.0.0.1), on each server alone.
            server.sql(
                "SET sql_log_bin = 0; CREATE USER IF NOT EXISTS 'root'@'127.0.0.1'; "
                "GRANT ALL ON *.* TO 'root'@'127.0.0.1' WITH GRANT OPTION"
            )
        pair.replica.sql(
            f"CHANGE MASTER TO MASTER_HOST = '127.0.0.1', MASTER_PORT = {pair.primary.port}, "
            "MASTER_USER = 'root', MASTER_USE_GTID = slave_pos; START SLAVE"
        )
        pair.primary.sql("CREATE DATABASE agentcontext_pair_ready")
        pair.caught_up()
    except (PairError, OSError, subprocess.TimeoutExpired, AssertionError) as exc:
        logs = " ".join(f"{s.log.name}: {s.log_tail()}" for s in (pair.primary, pair.replica))
        pair.remove()
        raise PairError(f"{exc} — {logs}") from exc
    return pair
