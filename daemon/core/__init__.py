"""The daemon's pure cores: plain classes and functions with no trio, no clock and no I/O.

Everything here is handed values and returns values (the sans-IO shape of h11 and wsproto), so it
is tested exhaustively without a server. The Trio shells beside this package in ``daemon/`` own
the processes, sockets, threads, files and time, and call into these modules:

- ``envelope``, ``splice``, ``sse_frames``: the event envelope encoded once, the agent's bytes
  spliced into it, SSE frames built once per wake-up.
- ``live_journal``, ``compactor``, ``replay_window``: the unfinished turn's bounded journal,
  turn-boundary compaction, the replay window of completed turns.
- ``ring``, ``subscriber``: the event ring, the resume decision, the slow-client rules.
- ``acp_codec``: the ACP JSON-RPC line codec and request/response matching.
- ``prompt_lifecycle``: one prompt's state and the one terminal each way of ending gets.
- ``idempotency``: a prompt request with an ``Idempotency-Key``: replay, conflict or admit.
- ``transcript_ops``, ``restore``, ``checksum``: the transcript's records as data, the
  cold-restore rules, each stored row's checksum.
- ``guards``, ``openapi``, ``throttle``: request guards, the OpenAPI document, log rate limits.

The rule is enforced by ``daemon/core/ruff.toml`` (ruff's banned-api, TID251): a module here
that imports trio, an HTTP/WebSocket stack, a socket, a process, a thread, a file or the clock,
or any of the daemon's shell modules, fails ``make check``.
"""
