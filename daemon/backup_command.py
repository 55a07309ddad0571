"""``turnkeeper-daemon backup DEST``: a consistent copy of a data directory's transcript.

With the daemon stopped (the data directory's lock is free), the file is copied directly with
SQLite's backup API, under the lock. With the daemon running (its lock is held, or ``--url``
is given), no other process can read the file, so the running daemon makes the copy
(``POST /daemon/backup``, with the token of ``$QWEN_SERVER_TOKEN``) and this command writes
the bytes it streams.

Either way the copy is written to ``DEST.partial`` first, checked with SQLite's
``quick_check``, synced and only then renamed to DEST: DEST exists only as a whole copy. A DEST
that exists already is refused, never overwritten. Exit status 0; 1 when the copy could not be
made (daemon unreachable, token refused, the daemon's error, a failed check); 2 for a bad
command line or a DEST that exists or cannot be written.
"""

from __future__ import annotations

import argparse
import os
import ssl
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

import httpx
import msgspec

from sdk.protocol import http as wire
from sdk.protocol import routes

from .config import DEFAULT_PORT, TOKEN_ENV, default_data_dir, env_var
from .transcript_backup import backup_file, check_copy

__all__ = ["run_backup"]

TRANSCRIPT_FILE = "transcript.sqlite3"
URL_ENV = "TURNKEEPER_URL"
CA_FILE_ENV = "TURNKEEPER_CA_FILE"


class BackupError(Exception):
    def __init__(self, message: str, status: int = 1) -> None:
        super().__init__(message)
        self.status = status


def _parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"{prog} backup", description=(
        "Write a consistent copy of the daemon's transcript to DEST, whether the daemon runs "
        "or not."))
    p.add_argument("dest", metavar="DEST", help="the file to write (must not exist)")
    p.add_argument("--data-dir", default=os.environ.get(env_var("--data-dir")),
                   help="the daemon's data directory (default: $TURNKEEPER_DATA_DIR, else "
                        "the daemon's default)")
    p.add_argument("--url", default=os.environ.get(URL_ENV),
                   help="the running daemon to ask (default: $TURNKEEPER_URL, else "
                        f"http://127.0.0.1:{DEFAULT_PORT} when the data directory is locked)")
    p.add_argument("--ca-file", default=os.environ.get(CA_FILE_ENV),
                   help="PEM file to check an https daemon's certificate against (default: "
                        "$TURNKEEPER_CA_FILE, else the system's CAs)")
    return p


def run_backup(argv: Sequence[str], prog: str, out: TextIO = sys.stdout) -> int:
    args = _parser(prog).parse_args(list(argv))
    dest = Path(args.dest)
    partial = Path(f"{dest}.partial")
    try:
        _claim(dest, partial)
    except BackupError as exc:
        print(f"{prog} backup: {exc}", file=sys.stderr)
        return exc.status
    try:
        how = _take(args, partial)
        problems = check_copy(partial)
        if problems:
            raise BackupError(f"the copy is not whole (quick_check: {problems[0]}); "
                              "nothing was written to DEST")
        with open(partial, "rb") as handle:
            os.fsync(handle.fileno())
        if dest.exists():  # made meanwhile by someone else: theirs stays
            raise BackupError(f"{dest} appeared while the backup ran; not overwriting it", 2)
        os.rename(partial, dest)
    except BackupError as exc:
        print(f"{prog} backup: {exc}", file=sys.stderr)
        return exc.status
    finally:
        for leftover in (partial, Path(f"{partial}-journal"), Path(f"{partial}-wal"),
                         Path(f"{partial}-shm")):
            try:
                leftover.unlink()
            except FileNotFoundError:
                pass
    print(f"backup: {dest} written ({dest.stat().st_size} bytes, {how})", file=out)
    return 0


def _claim(dest: Path, partial: Path) -> None:
    """Refuse a DEST that exists; create ``partial`` (empty) to prove DEST's directory can be
    written, before any work is done."""
    if dest.exists() or dest.is_symlink():
        raise BackupError(f"{dest} exists; refusing to overwrite it (choose a new file)", 2)
    try:
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise BackupError(f"{partial} exists (another backup to {dest} running, or one "
                          "interrupted: remove it)", 2) from None
    except OSError as exc:
        raise BackupError(f"cannot write {dest}: {exc.strerror} ({partial})", 2) from None
    os.close(fd)
    os.unlink(partial)  # SQLite (or the download) makes it again


def _take(args: argparse.Namespace, partial: Path) -> str:
    """Write the copy to ``partial``; how it was taken."""
    from .server import DaemonStartError, acquire_lock

    if args.url is None:
        data_dir = Path(args.data_dir) if args.data_dir else default_data_dir()
        try:
            lock = acquire_lock(data_dir)
        except DaemonStartError:
            pass  # a daemon runs on it: ask it
        except OSError as exc:
            raise BackupError(f"cannot open the data directory {data_dir}: {exc}") from None
        else:
            try:
                source = data_dir / TRANSCRIPT_FILE
                if not source.is_file():
                    raise BackupError(f"no transcript in {data_dir}")
                try:
                    backup_file(source, partial)
                except OSError as exc:
                    raise BackupError(f"cannot write the copy: {exc}") from None
                except Exception as exc:
                    raise BackupError(f"cannot copy {source}: {exc}") from None
            finally:
                lock.close()
            return f"copied from {data_dir}, the daemon is stopped"
    url = args.url or f"http://127.0.0.1:{DEFAULT_PORT}"
    _download(url, partial, args.ca_file)
    return f"taken by the daemon at {url}"


def _download(url: str, partial: Path, ca_file: str | None) -> None:
    token = os.environ.get(TOKEN_ENV)
    auth = {"Authorization": f"Bearer {token}"} if token else {}
    verify: ssl.SSLContext | bool = (ssl.create_default_context(cafile=ca_file)
                                     if ca_file else True)
    timeout = httpx.Timeout(10.0, read=None)  # the copy is made before the first byte
    try:
        with httpx.Client(base_url=url, timeout=timeout, verify=verify) as client, \
                client.stream(routes.BACKUP.method, routes.BACKUP.url(), headers=auth) as resp:
            if resp.status_code != 200:
                resp.read()
                raise BackupError(_refusal(url, resp))
            expected = int(resp.headers.get("Content-Length", "-1"))
            written = 0
            with open(partial, "xb") as handle:
                for chunk in resp.iter_bytes():
                    handle.write(chunk)
                    written += len(chunk)
            if expected >= 0 and written != expected:
                raise BackupError(f"the daemon's answer ended after {written} of {expected} "
                                  "bytes")
    except httpx.ConnectError as exc:
        raise BackupError(f"the daemon at {url} is unreachable ({exc}); is it running on "
                          "this data directory? (--url)") from None
    except httpx.HTTPError as exc:
        raise BackupError(f"the backup from {url} failed: {type(exc).__name__}: {exc}") \
            from None
    except OSError as exc:
        raise BackupError(f"cannot write the copy: {exc}") from None


def _refusal(url: str, resp: httpx.Response) -> str:
    try:
        body = msgspec.json.decode(resp.content, type=wire.ErrorBodyView)
        code, message = body.code, body.error
    except msgspec.DecodeError:
        code, message = None, resp.text[:200]
    if resp.status_code in (401, 403):
        given = "the token given" if os.environ.get(TOKEN_ENV) else "no token"
        return (f"the daemon at {url} refused {given} ({resp.status_code} {code}): set "
                f"${TOKEN_ENV} to its token")
    return f"the daemon at {url} answered {resp.status_code} {code}: {message}"
