"""A private PostgreSQL cluster for tests: Debian's server binaries, a temp dir, a free port.

PostgreSQL refuses to run as root, so as root ``initdb`` and ``pg_ctl`` run as the
``postgres`` user (``runuser -u postgres --``) in a directory that user owns. The
cluster listens on 127.0.0.1 only, with its unix socket in its own directory, trusts
local connections, and skips durability (``fsync=off``): it lives for one test session
and is always stopped with ``pg_ctl stop -m immediate``.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator


class ClusterUnavailable(Exception):
    """This machine cannot start a PostgreSQL server; the message says why."""


@dataclass(frozen=True)
class Cluster:
    port: int
    root: Path

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        """A fresh database in the cluster; returns its URL."""
        import psycopg2

        conn = psycopg2.connect(host="127.0.0.1", port=self.port, user="postgres", dbname="postgres")
        try:
            conn.autocommit = True
            with conn.cursor() as cur:
                cur.execute(f'CREATE DATABASE "{name}"')
        finally:
            conn.close()
        return self.url(name)


def server_bin_dir() -> Path:
    """Where initdb and pg_ctl are: on PATH, else Debian's newest /usr/lib/postgresql/N/bin."""
    found = shutil.which("pg_ctl")
    if found and shutil.which("initdb"):
        return Path(found).resolve().parent
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"), key=lambda p: int(Path(p).parts[-3]))
    if not versions:
        raise ClusterUnavailable("no PostgreSQL server binaries (apt-get install postgresql)")
    return Path(versions[-1]).parent


def _as_server_user() -> list[str]:
    if os.geteuid() != 0:
        return []
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        raise ClusterUnavailable(
            "running as root and there is no `postgres` user to run the server as"
        ) from None
    if not shutil.which("runuser"):
        raise ClusterUnavailable("running as root without `runuser` to start the server as `postgres`")
    return ["runuser", "-u", "postgres", "--"]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def private_cluster() -> Iterator[Cluster]:
    """Start a throwaway cluster; raise ``ClusterUnavailable`` if it cannot start."""
    bin_dir = server_bin_dir()
    prefix = _as_server_user()
    root = Path(tempfile.mkdtemp(prefix="tuner-pg-"))
    if prefix:
        entry = pwd.getpwnam("postgres")
        os.chown(root, entry.pw_uid, entry.pw_gid)
    data, log = root / "data", root / "server.log"
    started = False
    try:
        init = subprocess.run(
            [
                *prefix,
                str(bin_dir / "initdb"),
                "-D",
                str(data),
                "-U",
                "postgres",
                "-A",
                "trust",
                "-E",
                "UTF8",
                "--no-sync",
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if init.returncode != 0:
            raise ClusterUnavailable(f"initdb failed: {(init.stderr or init.stdout).strip()[-500:]}")
        port = _free_port()
        options = f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200"
        start = subprocess.run(
            [
                *prefix,
                str(bin_dir / "pg_ctl"),
                "-D",
                str(data),
                "-l",
                str(log),
                "-o",
                options,
                "-w",
                "-t",
                "60",
                "start",
            ],
            capture_output=True,
            text=True,
            timeout=90,
        )
        started = True  # even a failed start may have left a postmaster to stop
        if start.returncode != 0:
            tail = log.read_text()[-500:] if log.exists() else start.stderr
            raise ClusterUnavailable(f"pg_ctl start failed: {tail.strip()}")
        yield Cluster(port=port, root=root)
    finally:
        if started:
            subprocess.run(
                [*prefix, str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"],
                capture_output=True,
                timeout=60,
            )
        shutil.rmtree(root, ignore_errors=True)
