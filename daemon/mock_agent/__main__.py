"""``python -m daemon.mock_agent``: run the bundled mock agent on stdin/stdout."""

from daemon.mock_agent.agent import main

main()
