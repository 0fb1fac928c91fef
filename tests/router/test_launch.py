"""The router as a subprocess (the plain run's way): flags from the config, the token only in the env."""
from __future__ import annotations

import httpx

from miles.config import RouterConfig
from miles.router.launch import launch_router, router_command


def test_command_line_carries_the_config_but_never_the_token():
    config = RouterConfig(router_policy="round-robin", disable_rollout_health_check=True, router_admin_token="tok-123")
    argv = router_command(config, "127.0.0.1", 31100, ["http://127.0.0.1:31000"])
    assert argv[1:3] == ["-m", "miles.router.cli"]
    assert argv[argv.index("--router-policy") + 1] == "round-robin"
    assert "--disable-rollout-health-check" in argv and "--worker-urls" in argv
    assert not any("tok-123" in a for a in argv) and "--router-admin-token" not in argv


def test_launched_router_answers_and_requires_its_token(tmp_path):
    config = RouterConfig(router_admin_token="tok-456")
    router = launch_router(config, log_path=tmp_path / "router.log")
    try:
        assert httpx.get(f"{router.url}/router_health").status_code == 200
        # the token reached the child through its environment: admin calls need it
        assert httpx.post(f"{router.url}/update_weight_version", json={"weight_version": "1"}).status_code == 401
        ok = httpx.post(f"{router.url}/update_weight_version", json={"weight_version": "1"},
                        headers={"Authorization": "Bearer tok-456"})
        assert ok.status_code == 200
    finally:
        assert router.stop() is not None
    assert "tok-456" not in (tmp_path / "router.log").read_text()
