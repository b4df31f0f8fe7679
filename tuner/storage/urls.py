"""Storage URLs: passwords never printed, raw special characters in passwords understood.

``safe_url`` is the only form of a storage URL that is printed, logged or stored: SQLAlchemy's
parser renders it with the password as ``***``. A password typed raw into a URL (``/``,
``:`` or ``@`` in it, not percent-encoded) is first percent-encoded by ``normalize_url``,
taking everything up to the last ``@`` as the user part, so that neither the parser nor
the redaction splits it (a raw ``@`` would otherwise leave the password's tail in the
host name, printed in clear).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from urllib.parse import quote, unquote

_sqlite_files: list[Path] = []  # every SQLite file this process handed to SQLAlchemy, oldest first


def normalize_url(url: str) -> str:
    """The URL with its password percent-encoded (once), as SQLAlchemy and libpq expect it."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.startswith("sqlite") or "@" not in rest:
        return url
    userinfo, host = rest.rsplit("@", 1)
    user, colon, password = userinfo.partition(":")
    if not colon:
        return url
    return f"{scheme}://{user}:{quote(unquote(password), safe='')}@{host}"


def safe_url(url: str) -> str:
    """The storage URL without its password, for messages and logs."""
    from sqlalchemy.engine import make_url  # an optuna dependency

    if url.startswith("sqlite"):
        return url  # a file path: no password
    try:
        return make_url(normalize_url(url)).render_as_string(hide_password=True)
    except Exception:  # not a URL SQLAlchemy parses: keep the scheme and the host, nothing before '@'
        scheme, sep, rest = url.partition("://")
        return f"{scheme}{sep}***@{rest.rsplit('@', 1)[1]}" if "@" in rest else url


def scrub(text: str, url: str) -> str:
    """``text`` (an error message) with the URL's password replaced, in every spelling."""
    scheme, sep, rest = url.partition("://")
    if not sep or "@" not in rest:
        return text
    password = rest.rsplit("@", 1)[0].partition(":")[2]
    for spelling in {url, normalize_url(url)}:
        text = text.replace(spelling, safe_url(url))
    for secret in {password, unquote(password), quote(unquote(password), safe="")} - {""}:
        text = text.replace(secret, "***")
    return text


def with_driver(url: str) -> str:
    """``postgresql://`` means psycopg2 to SQLAlchemy 2.0 and psycopg 3 to 2.1: name the
    driver that is installed, so the documented URL works with either. The password is
    percent-encoded (see ``normalize_url``)."""
    url = normalize_url(url)
    db = sqlite_path(url)
    if db is not None and db not in _sqlite_files:
        _sqlite_files.append(db)
    if url.startswith("postgresql://"):
        for module in ("psycopg", "psycopg2"):
            if importlib.util.find_spec(module):
                return url.replace("postgresql://", f"postgresql+{module}://", 1)
    return url


SUPPORTED = "SQLite (sqlite:///PATH) or PostgreSQL (postgresql://USER:PASSWORD@HOST:PORT/DB)"


def check_scheme(url: str) -> None:
    """Only SQLite and PostgreSQL store studies: any other URL (mysql://, a bare path) is one line
    naming its scheme, before SQLAlchemy asks for a driver the tuner would never use."""
    from tuner.errors import UserError

    scheme, sep, _ = url.partition("://")
    if sep and scheme.split("+", 1)[0] in ("sqlite", "postgresql"):
        return
    given = f"the scheme {scheme + sep!r}" if sep else "no scheme (SCHEME://...)"
    raise UserError(
        f"storage {safe_url(url)}: {given} is not supported; the tuner stores studies in {SUPPORTED}"
    )


def sqlite_path(url: str) -> Path | None:
    """The database file of a SQLite URL (None for other storages and in-memory SQLite)."""
    if not url.startswith("sqlite:///") or url == "sqlite:///:memory:":
        return None
    path = url.removeprefix("sqlite:///")
    if path.startswith("file:"):  # sqlite:///file:PATH?mode=ro&uri=true
        path = path.removeprefix("file:").split("?", 1)[0]
    return Path(path)


def sqlite_files_used() -> list[Path]:
    """The SQLite files this process opened (through ``with_driver``), oldest first."""
    return list(_sqlite_files)
