"""Run a command in a network namespace of its own with only the loopback interface up.

``python -m tests.agent_matrix.offline COMMAND ...``: the agent matrix runs this way so that no
agent can reach the internet even if it ignores the base URL it was given: the fake model
server, the daemon and the agents all live on this namespace's 127.0.0.1, and anything else
fails at once (no route). Needs the right to create namespaces (root, as here and in CI); where
that is refused the command runs unisolated and a note says so (``AGENT_MATRIX_REQUIRE_OFFLINE=1``
makes that an error instead). Linux only; standard library only (``unshare(2)`` and an ioctl
through ctypes, since ``os.unshare`` needs Python 3.12).
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import socket
import struct
import sys

CLONE_NEWNET = 0x40000000
SIOCGIFFLAGS = 0x8913
SIOCSIFFLAGS = 0x8914
IFF_UP = 0x1


def isolate() -> str | None:
    """Enter a new network namespace and bring its loopback up; None on success, else why not."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWNET) != 0:
        return f"unshare(CLONE_NEWNET) failed: {os.strerror(ctypes.get_errno())}"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sH", b"lo", 0)
        flags = struct.unpack("16sH", fcntl.ioctl(sock, SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(sock, SIOCSIFFLAGS, struct.pack("16sH", b"lo", flags | IFF_UP))
    return None


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python -m tests.agent_matrix.offline COMMAND ...", file=sys.stderr)
        return 2
    reason = isolate()
    if reason is not None:
        if os.environ.get("AGENT_MATRIX_REQUIRE_OFFLINE") == "1":
            print(f"agent-matrix: cannot isolate the network: {reason}", file=sys.stderr)
            return 1
        print(f"agent-matrix: NOTE: running with the machine's network ({reason}); the agents "
              "are still pointed at the fake model server", file=sys.stderr)
    else:
        print("agent-matrix: network namespace with loopback only", file=sys.stderr)
    os.environ["AGENT_MATRIX_OFFLINE"] = "0" if reason else "1"
    os.execvp(argv[0], argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
