"""The dashboard and alert rules a lab imports (docs/metrics.md): every metric they read is one
``/metrics`` serves, ``promtool`` accepts the rules, and a real Prometheus scraping SlotServe fires
the node-not-ready alert when a node's worker stops."""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import time
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
import yaml
from django.test import Client
from django.utils import timezone

from channels_app.models import Node
from tests import factories

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "docker" / "prometheus" / "slotserve-alerts.yml"
DASHBOARD = ROOT / "docker" / "grafana" / "slotserve-dashboard.json"
METRIC = re.compile(r"\bslotserve_[a-z_]+")


def served_metrics() -> set[str]:
    """The metric names a scrape of a small lab gives (counters with ``_total``, histograms with
    their ``_bucket``, ``_sum`` and ``_count``)."""
    body = Client().get("/metrics").content.decode()
    return {line.split("{")[0].split(" ")[0] for line in body.splitlines() if line.startswith("slotserve_")}


def expressions() -> list[str]:
    rules = [rule["expr"] for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]
    panels = [
        target["expr"]
        for panel in json.loads(DASHBOARD.read_text())["panels"]
        for target in panel.get("targets", [])
    ]
    assert rules and panels
    return rules + panels


@pytest.mark.django_db
def test_every_metric_the_dashboard_and_the_rules_read_is_served():
    from channels_app.models import ChannelRuntime, LoadRecord
    from slotserve_base.redis_client import redis_client
    from slotserve_base.vocabulary import Phase, RedisKey, redis_key

    # A lab with a little of everything: a channel running a model it loaded, a booking, an answer.
    node = factories.node("gpu-1")
    channel = factories.channel("a100-0", on=node)
    qwen = factories.llm("qwen")
    ChannelRuntime.objects.create(channel=channel, phase=Phase.READY, model=qwen, places=2)
    now = timezone.now()
    LoadRecord.objects.create(
        channel=channel,
        node=node,
        model=qwen,
        started=now - timedelta(seconds=30),
        finished=now,
        succeeded=True,
    )
    factories.reservation(owner=factories.user("ana"), on=channel, start=now, end=now + timedelta(hours=1))
    redis_client().hincrby(redis_key(RedisKey.GATEWAY_STATUS, "all"), "200", 1)  # as the gateway counts
    served = served_metrics()
    used = {name for expr in expressions() for name in METRIC.findall(expr)}
    assert used and used <= served, sorted(used - served)


@pytest.mark.skipif(shutil.which("promtool") is None, reason="needs promtool (apt-get install prometheus)")
def test_promtool_accepts_the_rules():
    checked = subprocess.run(["promtool", "check", "rules", str(RULES)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.skipif(
    shutil.which("prometheus") is None, reason="needs Prometheus (apt-get install prometheus)"
)
@pytest.mark.django_db(transaction=True)
def test_a_real_prometheus_fires_node_not_ready_when_a_nodes_worker_stops(live_server, tmp_path):
    node = factories.node("gpu-1")
    factories.channel("a100-0", on=node)
    # The rules as shipped, each "for" shortened so that the test need not wait minutes.
    rules = yaml.safe_load(RULES.read_text())
    for group in rules["groups"]:
        group["interval"] = "1s"
        for rule in group["rules"]:
            rule["for"] = "0s"
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(rules))
    port = free_port()
    (tmp_path / "prometheus.yml").write_text(
        yaml.safe_dump(
            {
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "rule_files": [str(tmp_path / "rules.yml")],
                "scrape_configs": [
                    {
                        "job_name": "slotserve",
                        "static_configs": [{"targets": [live_server.url.split("//")[1]]}],
                    }
                ],
            }
        )
    )
    prometheus = subprocess.Popen(
        [
            "prometheus",
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "prometheus.log").open("w"),
    )
    base = f"http://127.0.0.1:{port}"

    def alerts() -> dict[str, str]:
        try:
            found = httpx.get(f"{base}/api/v1/alerts", timeout=2).json()["data"]["alerts"]
        except (httpx.HTTPError, ValueError, KeyError):
            return {}
        return {a["labels"]["alertname"] + ":" + a["labels"].get("node", ""): a["state"] for a in found}

    def scraped() -> bool:
        try:
            targets = httpx.get(f"{base}/api/v1/targets", timeout=2).json()["data"]["activeTargets"]
        except (httpx.HTTPError, ValueError, KeyError):
            return False
        return any(t["health"] == "up" for t in targets)

    try:
        deadline = time.monotonic() + 60
        while not scraped() and time.monotonic() < deadline:
            time.sleep(0.5)
        assert scraped(), (tmp_path / "prometheus.log").read_text()[-2000:]
        time.sleep(3)
        assert "SlotServeNodeNotReady:gpu-1" not in alerts()  # its worker heartbeats
        Node.objects.filter(pk=node.pk).update(last_heartbeat=timezone.now() - timedelta(minutes=5))
        while alerts().get("SlotServeNodeNotReady:gpu-1") != "firing" and time.monotonic() < deadline:
            time.sleep(0.5)
        assert alerts().get("SlotServeNodeNotReady:gpu-1") == "firing", alerts()
    finally:
        prometheus.terminate()
        prometheus.wait(timeout=30)
