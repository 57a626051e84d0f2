"""deploy/grafana/adapterplane.json: a Grafana dashboard (schema 38 or newer) with a
`DS_PROMETHEUS` datasource variable and an `agent` variable, rows for agents, control
plane and routers, and on every panel a datasource and PromQL queries that `promtool`
accepts (Grafana's variables replaced by values they take). That every metric the
queries read is exported is tests/agent/test_observability_names.py."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from .observability import dashboard, metric_names, panels
from .test_prometheus_rules import promtool

DATASOURCE = {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$__interval": "1m", "$__range": "1h",
                     "$agent": ".+"}
ROWS = ["Agents", "Control plane", "Routers"]
AGENT_METRIC = re.compile(r"^(adapter_|joint_|prefix_cache_)")


def test_the_dashboard_is_a_grafana_dashboard_with_its_variables() -> None:
    doc = dashboard()
    assert doc["schemaVersion"] >= 38 and doc["uid"] and doc["title"]
    variables = {v["name"]: v for v in doc["templating"]["list"]}
    assert variables["DS_PROMETHEUS"]["type"] == "datasource"
    assert variables["DS_PROMETHEUS"]["query"] == "prometheus"
    agent = variables["agent"]
    assert agent["type"] == "query" and agent["datasource"] == DATASOURCE
    assert agent["multi"] and agent["includeAll"]
    assert [p["title"] for p in panels(doc) if p["type"] == "row"] == ROWS


def test_every_panel_has_a_datasource_and_queries() -> None:
    doc = dashboard()
    ids = [p["id"] for p in panels(doc)]
    assert len(ids) == len(set(ids))
    cells: set[tuple[int, int]] = set()
    for panel in panels(doc):
        pos = panel["gridPos"]
        mine = {(x, y) for x in range(pos["x"], pos["x"] + pos["w"])
                for y in range(pos["y"], pos["y"] + pos["h"])}
        assert pos["x"] + pos["w"] <= 24 and not mine & cells, panel["title"]  # no overlap
        cells |= mine
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == DATASOURCE, panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == DATASOURCE and target["expr"].strip(), panel["title"]
            assert metric_names(target["expr"]), (panel["title"], target["expr"])


def test_agent_panels_follow_the_agent_variable() -> None:
    row = None
    for panel in panels(dashboard()):
        if panel["type"] == "row":
            row = panel["title"]
            continue
        for target in panel["targets"]:
            agent_metrics = {n for n in metric_names(target["expr"]) if AGENT_METRIC.match(n)}
            if row == "Agents" and agent_metrics:
                selectors = re.findall(r"[a-z_:]+\{([^}]*)\}", target["expr"])
                assert selectors and all('instance=~"$agent"' in s for s in selectors), (
                    panel["title"], target["expr"])


def test_every_query_is_promql(tmp_path: Path) -> None:
    rules = []
    for panel in panels(dashboard()):
        for target in panel.get("targets", []):
            expr = target["expr"]
            for variable, example in GRAFANA_VARIABLES.items():
                expr = expr.replace(variable, example)
            assert "$" not in expr, target["expr"]
            rules.append({"record": f"dashboard:panel_{panel['id']}:{target['refId']}",
                          "expr": expr})
    (tmp_path / "dashboard.yml").write_text(yaml.safe_dump(
        {"groups": [{"name": "dashboard", "rules": rules}]}))
    assert f"{len(rules)} rules found" in promtool("check", "rules", "dashboard.yml",
                                                   cwd=tmp_path)
