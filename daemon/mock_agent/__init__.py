"""The bundled deterministic mock ACP agent, kept apart from the daemon proper.

``python -m daemon.mock_agent`` runs it; the daemon starts it when no ``--agent`` is given. It is
a separate process speaking ACP over stdio (stdlib only, no trio), so it lives beside the daemon's
cores and shells rather than among them. :mod:`daemon.mock_agent.agent` documents its knobs.
"""

from daemon.mock_agent.agent import (
    MockAgent,
    PlanError,
    PromptPlan,
    chunk_lines,
    main,
    plan_for_prompt,
    plan_from_env,
    prompt_text,
)

__all__ = [
    "MockAgent",
    "PlanError",
    "PromptPlan",
    "chunk_lines",
    "main",
    "plan_for_prompt",
    "plan_from_env",
    "prompt_text",
]
