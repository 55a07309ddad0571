"""Cutting off a connection whose writes are stalled.

Hypercorn shields its socket writes from cancellation, so a response blocked on a peer that
stopped reading cannot be interrupted from the application. When the slow-client rules evict
such a subscriber, the daemon shuts the TCP connection down instead: the blocked write then
fails, Hypercorn sees the connection closed, and the stream's task ends. The socket is found
by its (local, peer) address pair among this process's open descriptors.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Sequence

log = logging.getLogger("daemon.sockets")

_FD_DIR = "/proc/self/fd"


def _addr(value: Sequence[object] | None) -> tuple[str, int] | None:
    if value is None or len(value) < 2:
        return None
    host, port = value[0], value[1]
    if not isinstance(host, str) or not isinstance(port, int):
        return None
    return host, port


def shutdown_connection(server: Sequence[object] | None, client: Sequence[object] | None) -> bool:
    """Shut down the TCP socket whose local address is ``server`` and peer is ``client`` (the
    ASGI scope's values). Returns True if one was found."""
    local, peer = _addr(server), _addr(client)
    if local is None or peer is None:
        return False
    try:
        fds = [int(name) for name in os.listdir(_FD_DIR)]
    except OSError:
        return False
    for fd in fds:
        try:
            sock = socket.socket(fileno=os.dup(fd))
        except OSError:
            continue
        try:
            if sock.type != socket.SOCK_STREAM:
                continue
            if sock.getsockname()[:2] == local and sock.getpeername()[:2] == peer:
                sock.shutdown(socket.SHUT_RDWR)
                return True
        except OSError:
            continue
        finally:
            sock.close()
    log.warning("event=connection_not_found local=%s peer=%s", local, peer)
    return False
