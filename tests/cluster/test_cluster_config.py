"""The cluster-mode flags: names, environment variables, defaults, refusals."""

from __future__ import annotations

import pytest

from daemon.config import DEFAULT_LEASE_MS, ConfigError, build_parser, env_var, parse_config


def test_single_node_by_default() -> None:
    config = parse_config([], {})
    assert config.cluster_redis is None
    assert config.node_url is None and config.node_id is None
    assert config.lease_ms == DEFAULT_LEASE_MS == 10_000


SECRET = "0123456789abcdef"


def test_flags_and_their_environment_variables() -> None:
    config = parse_config(["--cluster-redis", "redis://127.0.0.1:6379/0", "--node-url",
                           "http://10.0.0.2:4170", "--node-id", "node-a.1", "--lease-ms", "1000",
                           "--cluster-secret", SECRET], {})
    assert config.cluster_redis == "redis://127.0.0.1:6379/0"
    assert config.node_url == "http://10.0.0.2:4170"
    assert config.node_id == "node-a.1"
    assert config.lease_ms == 1000
    assert config.cluster_secret == SECRET
    assert env_var("--cluster-redis") == "TURNKEEPER_CLUSTER_REDIS"
    assert env_var("--cluster-secret") == "TURNKEEPER_CLUSTER_SECRET"
    from_env = parse_config([], {"TURNKEEPER_CLUSTER_REDIS": "redis://h:1/2",
                                 "TURNKEEPER_NODE_ID": "n2", "TURNKEEPER_LEASE_MS": "2500",
                                 "TURNKEEPER_CLUSTER_SECRET": SECRET + "x"})
    assert (from_env.cluster_redis, from_env.node_id, from_env.lease_ms,
            from_env.cluster_secret) == ("redis://h:1/2", "n2", 2500, SECRET + "x")


def test_help_names_every_cluster_flag_with_its_variable() -> None:
    text = build_parser("daemon").format_help()
    for flag in ("--cluster-redis", "--node-url", "--node-id", "--lease-ms",
                 "--cluster-secret"):
        assert flag in text
        assert env_var(flag) in text


@pytest.mark.parametrize(("argv", "reason"), [
    (["--cluster-redis", "http://x"], "--cluster-redis must be a redis://"),
    (["--cluster-redis", "redis://x", "--no-persistence"], "cannot be combined"),
    (["--cluster-redis", "redis://x"], "--cluster-secret must be set"),
    (["--cluster-redis", "redis://x", "--cluster-secret", SECRET[:-1]],
     "at least 16 characters"),
    (["--node-url", "x:1"], "--node-url must be"),
    (["--node-id", "a b"], "--node-id must be"),
    (["--node-id", "x" * 65], "--node-id must be"),
    (["--lease-ms", "0"], "--lease-ms must be a positive integer"),
])
def test_refused(argv: list[str], reason: str) -> None:
    with pytest.raises(ConfigError, match=reason):
        parse_config(argv, {})
