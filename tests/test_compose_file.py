"""No Docker engine runs here, so the Compose file is checked against the code instead."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from slotserve_site.running import parts

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = yaml.safe_load((ROOT / "docker" / "compose.yaml").read_text())
SERVICES = COMPOSE["services"]
SLOTSERVE_SERVICES = ("web", "scheduler", "decisions", "webhooks", "node-worker")


# The settings module and the functions it calls to read the environment.
SETTINGS_SOURCES = (
    "slotserve_site/settings.py",
    "slotserve_site/database_settings.py",
    "slotserve_site/sign_in_settings.py",
    "slotserve_site/gateway_settings.py",
    "slotserve_site/placement_settings.py",
    "slotserve_base/env.py",
)


def settings_read() -> set[str]:
    """Every environment variable the settings read."""
    source = "\n".join((ROOT / path).read_text() for path in SETTINGS_SOURCES)
    return set(re.findall(r'env_\w+\(\s*"([A-Z_]+)"', source))


def test_services_images_and_health_checks():
    assert set(SERVICES) == {"postgres", "redis", "web", "scheduler", "decisions", "webhooks", "node-worker"}
    assert SERVICES["postgres"]["image"].startswith("postgres:")
    assert SERVICES["redis"]["image"].startswith("redis:")
    for name in SLOTSERVE_SERVICES:
        assert SERVICES[name]["image"] == "slotserve:latest"
        assert SERVICES[name]["build"]["dockerfile"] == "docker/Dockerfile"
    for name, service in SERVICES.items():
        assert service["healthcheck"]["test"][0] == "CMD", name


def test_commands_start_each_role():
    assert "uvicorn slotserve_site.asgi:application" in " ".join(SERVICES["web"]["command"])
    # SlotServe reads X-Forwarded-For itself, from the proxies it trusts; a connection limit.
    assert "--no-proxy-headers --limit-concurrency" in " ".join(SERVICES["web"]["command"])
    assert "manage.py migrate" in " ".join(SERVICES["web"]["command"])
    scheduler = SERVICES["scheduler"]["command"]
    assert scheduler[:4] == ["celery", "-A", "slotserve_site", "worker"] and "--beat" in scheduler
    assert scheduler[scheduler.index("--queues") + 1] == "${SLOTSERVE_REDIS_PREFIX:-slotserve}.scheduler"
    # Decisions on a worker of their own, one task at a time: never behind the long jobs.
    decisions = SERVICES["decisions"]["command"]
    assert decisions[:4] == ["celery", "-A", "slotserve_site", "worker"] and "--beat" not in decisions
    assert decisions[decisions.index("--queues") + 1] == "${SLOTSERVE_REDIS_PREFIX:-slotserve}.decisions"
    assert decisions[decisions.index("--prefetch-multiplier") + 1] == "1"
    # Deliveries on a worker of their own: a slow receiver never holds the scheduler's.
    webhooks = SERVICES["webhooks"]["command"]
    assert webhooks[:4] == ["celery", "-A", "slotserve_site", "worker"] and "--beat" not in webhooks
    assert webhooks[webhooks.index("--queues") + 1] == "${SLOTSERVE_REDIS_PREFIX:-slotserve}.webhooks"
    # As `slotserve run` starts them: no mingle nor gossip to redo on each reconnection to Redis.
    for worker, started_by_run in (
        (scheduler, parts.scheduler_command()),
        (decisions, parts.decisions_command()),
        (webhooks, parts.webhooks_command()),
    ):
        assert {"--without-mingle", "--without-gossip"} <= set(worker) & set(started_by_run)
    assert SERVICES["node-worker"]["command"] == ["python", "manage.py", "nodeworker"]
    assert SERVICES["node-worker"]["runtime"] == "nvidia"
    assert any(v.endswith(":/models:ro") for v in SERVICES["node-worker"]["volumes"])


@pytest.mark.parametrize("name", SLOTSERVE_SERVICES)
def test_each_service_gets_the_settings_it_needs_and_only_real_ones(name):
    environment = SERVICES[name]["environment"]
    known = settings_read() | {"NVIDIA_VISIBLE_DEVICES"}
    unknown = {var for var in environment if var not in known}
    assert unknown == set(), f"{name} sets variables SlotServe does not read: {unknown}"
    needed = {"DATABASE_URL", "SLOTSERVE_REDIS_URL", "SLOTSERVE_SECRET_KEY"}
    needed |= {
        # The gateway's own settings reach it: browsers' origins, fair sharing, how long to hold.
        "web": {
            "SLOTSERVE_ALLOWED_HOSTS",
            "SLOTSERVE_CSRF_TRUSTED_ORIGINS",
            "SLOTSERVE_CORS_ORIGINS",
            "SLOTSERVE_LIMIT_CONCURRENT_REQUESTS",
            "SLOTSERVE_LIMIT_REQUESTS_PER_MINUTE",
            "SLOTSERVE_LIMIT_WEEKLY_TOKENS",
            "SLOTSERVE_GATEWAY_MAX_WAIT_SECONDS",
        },
        "scheduler": {"SLOTSERVE_REQUEST_LOG_DAYS"},  # its usage flush prunes the request log
        "decisions": {"SLOTSERVE_TICK_SECONDS"},  # a boundary near is decided at its moment
        # Where receivers may be, and the deadline of a try.
        "webhooks": {"SLOTSERVE_WEBHOOK_ALLOWED_NETWORKS", "SLOTSERVE_WEBHOOK_TIMEOUT_SECONDS"},
        "node-worker": {"SLOTSERVE_NODE_NAME", "SLOTSERVE_PROCESS_HOST", "SLOTSERVE_MODEL_DIRS"},
    }[name]
    assert needed <= set(environment), needed - set(environment)


def test_env_example_defines_every_variable_compose_needs():
    text = (ROOT / "docker" / "compose.yaml").read_text()
    required = set(re.findall(r"\$\{([A-Z_]+)\}", text))  # used without a default
    example = {
        line.split("=", 1)[0]
        for line in (ROOT / "docker" / ".env.example").read_text().splitlines()
        if line and not line.startswith("#")
    }
    assert required <= example, required - example


def test_dockerfile_copies_every_package():
    dockerfile = (ROOT / "docker" / "Dockerfile").read_text()
    # Every package of the tree (devtools too: the demo's tiny model and stand-in, which
    # `manage.py run --demo` imports), but the tests and benchmarks; a new package is found.
    packages = {path.parent.name for path in ROOT.glob("*/__init__.py")} - {"tests", "bench"}
    assert {"gateway", "slotserve_base", "devtools"} <= packages
    for package in (*sorted(packages), "templates"):
        assert f"COPY {package} {package}" in dockerfile, package


def test_redis_and_postgres_are_not_published_to_everyone_and_redis_has_a_password():
    for name in ("redis", "postgres"):
        for mapping in SERVICES[name].get("ports", []):
            # host address:host port:container port — never a bare "6379:6379" (every interface)
            assert mapping.count(":") == 2 and mapping.startswith("${SLOTSERVE_PRIVATE_ADDRESS}:"), mapping
    assert "--requirepass" in SERVICES["redis"]["command"]
    renamed = " ".join(SERVICES["redis"]["command"])
    for command in ("CONFIG", "MODULE", "DEBUG", "REPLICAOF"):
        assert f"--rename-command {command}  " in renamed + " ", renamed
    redis_url = COMPOSE["x-slotserve"]["environment"]["SLOTSERVE_REDIS_URL"]
    assert redis_url.startswith("redis://:${REDIS_PASSWORD}@"), redis_url
    assert COMPOSE["x-slotserve"]["environment"]["SLOTSERVE_HTTPS"].startswith("${SLOTSERVE_HTTPS")


def test_every_service_shares_the_installations_prefix():
    """Keys and queues carry SLOTSERVE_REDIS_PREFIX: a node worker with another prefix would
    listen on a queue nobody sends to."""
    prefixes = {SERVICES[name]["environment"].get("SLOTSERVE_REDIS_PREFIX") for name in SLOTSERVE_SERVICES}
    assert prefixes == {"${SLOTSERVE_REDIS_PREFIX:-slotserve}"}
