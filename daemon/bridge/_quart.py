"""The daemon's extensions of Quart: a body written from parts, and JSON for HTTP errors.

- :class:`PartsBody`: a response body handed to Quart as a list of byte strings, one ASGI send
  each, for a load whose journal is megabytes of pre-encoded envelopes: they go to the socket
  from where they already lie instead of being copied into one fresh body first (for 8 MiB, a
  copy into pages the kernel must first map and zero, which cost more than the copy itself).
- :class:`JsonErrorsQuart`: the errors Quart raises itself (no route, a method the route does
  not take, a body over the limit) are answered by the daemon's own handler, which gets the
  status, the description and the allowed methods, never Quart's exception classes (they
  belong to a library the daemon does not depend on directly). Its routes compile their URL
  builders (:class:`LazyBuilderRule`) only when a URL is built.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Collection
from types import TracebackType
from typing import Any

from quart import Response
from quart.routing import QuartRule
from quart.wrappers.response import ResponseBody
from quart_trio import QuartTrio

__all__ = ["HttpErrorHandler", "JsonErrorsQuart", "LazyBuilderRule", "PartsBody"]

#: ``(status, description, allowed methods or None) -> response``.
HttpErrorHandler = Callable[[int, str | None, Collection[str] | None], Awaitable[Response]]


class PartsBody(ResponseBody):
    """A response body written as a list of byte strings, one ASGI send each. The caller sets
    Content-Length: the bytes on the wire are those of the joined body."""

    def __init__(self, parts: list[bytes]) -> None:
        self.parts = parts

    async def __aenter__(self) -> PartsBody:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc_value: BaseException | None, tb: TracebackType | None) -> None:
        pass

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._gen()

    async def _gen(self) -> AsyncIterator[bytes]:
        for part in self.parts:
            yield part


class LazyBuilderRule(QuartRule):
    """A route whose URL builders are compiled by the first URL built with them. Werkzeug
    compiles two builders (Python code generated for the rule) per route as the route is
    added; the daemon matches requests and builds no URL while it serves, so an idle daemon
    would hold that code for every route for nothing (tests/daemon/test_idle_footprint.py)."""

    def _compile_builder(self, append_unknown: bool = True) -> Callable[..., tuple[str, str]]:
        name = "_build_unknown" if append_unknown else "_build"
        compile_builder = super()._compile_builder  # Werkzeug's, called at the first build

        def build(rule: LazyBuilderRule, **values: Any) -> tuple[str, str]:
            compiled: Callable[..., tuple[str, str]] = \
                compile_builder(append_unknown).__get__(rule, None)
            setattr(rule, name, compiled)  # later builds call Werkzeug's own builder
            return compiled(**values)

        return build


class JsonErrorsQuart(QuartTrio):
    """A Quart-Trio app whose own HTTP errors (4xx, 5xx) go to :attr:`http_error_handler`."""

    url_rule_class: type[QuartRule] = LazyBuilderRule
    http_error_handler: HttpErrorHandler | None = None

    async def handle_http_exception(self, error: Any) -> Any:
        status = getattr(error, "code", None)
        handler = self.http_error_handler
        if handler is None or not isinstance(status, int) or status < 400:
            return await super().handle_http_exception(error)  # redirects and the like
        return await handler(status, getattr(error, "description", None),
                             getattr(error, "valid_methods", None))
