"""The web viewer's static files (``daemon/ui/``), served at ``/ui/`` (no build step).

The files are read once, from the package directory, by the first request that needs one (a
daemon nobody opens the viewer of never holds them); only names found there are served (no path is ever joined from a request), each with its content type,
``Cache-Control: no-cache`` and a Content-Security-Policy that lets the page load nothing but
its own files and talk to nothing but its own daemon. ``/ui`` redirects to ``/ui/``, the root
``/`` to the viewer and ``/favicon.ico`` to its icon; anything else under ``/ui/`` is a 404
``route_not_found``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

import msgspec

UI_DIR: Final = Path(__file__).with_name("ui")
INDEX: Final = "index.html"
FAVICON: Final = "favicon.svg"
# Where a browser pointed at the daemon itself lands (302: the root may serve more one day).
REDIRECTS: Final = {"/": (302, b"/ui/"), "/ui": (308, b"/ui/"),
                    "/favicon.ico": (308, f"/ui/{FAVICON}".encode())}
CONTENT_TYPES: Final = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".png": "image/png",
}
CSP: Final = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
              "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")


class UiAnswer(msgspec.Struct, frozen=True):
    status: int
    headers: list[tuple[bytes, bytes]]
    body: bytes


def _headers(content_type: str, length: int) -> list[tuple[bytes, bytes]]:
    return [(b"content-type", content_type.encode()),
            (b"content-length", str(length).encode()),
            (b"cache-control", b"no-cache"),
            (b"x-content-type-options", b"nosniff"),
            (b"referrer-policy", b"no-referrer"),
            (b"content-security-policy", CSP.encode())]


class UiFiles:
    """The viewer's files by name, loaded once, when first asked for."""

    def __init__(self, root: Path = UI_DIR) -> None:
        self.root = root
        self._files: dict[str, tuple[str, bytes]] | None = None

    @property
    def files(self) -> dict[str, tuple[str, bytes]]:
        if self._files is None:
            files: dict[str, tuple[str, bytes]] = {}
            if self.root.is_dir():
                for path in sorted(self.root.iterdir()):
                    content_type = CONTENT_TYPES.get(path.suffix)
                    if path.is_file() and content_type is not None:
                        files[path.name] = (content_type, path.read_bytes())
            self._files = files
        return self._files

    @property
    def loaded(self) -> bool:
        """Have the files been read (by a request that needed one)?"""
        return self._files is not None

    def answer(self, method: str, path: str) -> UiAnswer | None:
        """The answer to a GET/HEAD under ``/ui``; ``None`` when the file does not exist."""
        redirect = REDIRECTS.get(path)
        if redirect is not None:
            status, location = redirect
            return UiAnswer(status, [(b"location", location), (b"content-length", b"0"),
                                     (b"cache-control", b"no-cache")], b"")
        name = path[len("/ui/"):] or INDEX
        found = self.files.get(name)
        if found is None:
            return None
        content_type, body = found
        return UiAnswer(200, _headers(content_type, len(body)), b"" if method == "HEAD" else body)
