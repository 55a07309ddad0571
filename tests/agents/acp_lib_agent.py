"""A tiny ACP agent built on the official ``agent-client-protocol`` library (import name ``acp``).

It proves the daemon's channel interoperates with an implementation it did not write. Run as
``python tests/agents/acp_lib_agent.py``. Each prompt streams ``lib-chunk-0`` ...
``lib-chunk-<N-1>`` (N = ``ACP_LIB_AGENT_CHUNKS``, default 3) as ``agent_message_chunk``
updates and ends with ``end_turn``. A prompt whose text contains ``ask-permission`` first asks
the client with ``session/request_permission`` and reports the outcome as one more chunk,
``permission:<optionId>`` or ``permission:cancelled``.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from typing import Any, cast

from acp import (
    PROTOCOL_VERSION,
    Agent,
    Client,
    InitializeResponse,
    NewSessionResponse,
    PromptResponse,
    run_agent,
    update_agent_message_text,
)
from acp.schema import (
    AgentCapabilities,
    AllowedOutcome,
    Implementation,
    PermissionOption,
    ToolCallUpdate,
)


class LibAgent:
    """Implements the subset of ``acp.Agent`` a prompt turn needs (the library checks by name)."""

    def __init__(self) -> None:
        self._client: Client | None = None
        self._chunks = int(os.environ.get("ACP_LIB_AGENT_CHUNKS", "3"))

    def on_connect(self, conn: Client) -> None:
        self._client = conn

    async def initialize(
        self,
        protocol_version: int,
        client_capabilities: Any = None,
        client_info: Any = None,
        **kwargs: Any,
    ) -> InitializeResponse:
        return InitializeResponse(
            protocol_version=PROTOCOL_VERSION,
            agent_capabilities=AgentCapabilities(load_session=False),
            agent_info=Implementation(name="acp-lib-test-agent", version="1"),
        )

    async def new_session(
        self,
        cwd: str,
        additional_directories: list[str] | None = None,
        mcp_servers: Any = None,
        **kwargs: Any,
    ) -> NewSessionResponse:
        return NewSessionResponse(session_id=f"lib-{uuid.uuid4()}")

    async def prompt(self, session_id: str, prompt: list[Any], **kwargs: Any) -> PromptResponse:
        client = self._client
        assert client is not None
        text = " ".join(getattr(block, "text", "") for block in prompt)
        if "ask-permission" in text:
            response = await client.request_permission(
                session_id=session_id,
                tool_call=ToolCallUpdate(tool_call_id="call-1", title="write a file"),
                options=[
                    PermissionOption(option_id="allow-once", name="Allow", kind="allow_once"),
                    PermissionOption(option_id="reject-once", name="Reject", kind="reject_once"),
                ],
            )
            outcome = response.outcome
            verdict = outcome.option_id if isinstance(outcome, AllowedOutcome) else "cancelled"
            await client.session_update(
                session_id=session_id, update=update_agent_message_text(f"permission:{verdict}")
            )
        for i in range(self._chunks):
            await client.session_update(
                session_id=session_id, update=update_agent_message_text(f"lib-chunk-{i}")
            )
        return PromptResponse(stop_reason="end_turn")

    async def cancel(self, session_id: str, **kwargs: Any) -> None:
        return None


def main() -> None:
    asyncio.run(run_agent(cast(Agent, LibAgent())))


if __name__ == "__main__":
    main()
