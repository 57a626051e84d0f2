"""The PromQL of deploy/grafana/adapterplane.json and deploy/prometheus/alerts.yml, and the
metric names it reads, for the checks in tests/deploy and tests/agent.

`metric_names(expr)` is a small lexer, not a PromQL parser: it removes string literals,
label matchers (`{...}`), range and subquery brackets (`[...]`), the label lists of
`by`/`without`/`on`/`ignoring`/`group_left`/`group_right` and `offset` durations, then
keeps the identifiers that are not called (functions, aggregations) and are not
keywords. Grafana variables only appear inside matchers and ranges, so they go with them.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "adapterplane.json"
PROMETHEUS = ROOT / "deploy" / "prometheus"
ALERTS = PROMETHEUS / "alerts.yml"
SYNTHETIC = frozenset({"up"})
"""Series Prometheus writes itself for every scrape target."""

_STRING = re.compile(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^}]*\}")
_BRACKETS = re.compile(r"\[[^\]]*\]")
_LABEL_LISTS = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_OFFSET = re.compile(r"\boffset\s+-?[0-9a-zA-Z]+")
_IDENTIFIER = re.compile(r"(?<![\w:.$])([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(\()?")
KEYWORDS = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right", "bool",
                      "and", "or", "unless", "offset", "inf", "nan", "atan2"})


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads (see module doc)."""
    text = _STRING.sub('""', expr)
    for pattern in (_MATCHERS, _BRACKETS, _LABEL_LISTS, _OFFSET):
        text = pattern.sub(" ", text)
    return {m.group(1) for m in _IDENTIFIER.finditer(text)
            if m.group(2) is None and m.group(1).lower() not in KEYWORDS}


def dashboard() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return doc


def panels(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Every panel, rows' collapsed children included."""
    out: list[dict[str, Any]] = []
    for panel in doc["panels"]:
        out.append(panel)
        out.extend(panel.get("panels", []))
    return out


def dashboard_exprs() -> list[str]:
    doc = dashboard()
    exprs = [t["expr"] for p in panels(doc) for t in p.get("targets", [])]
    for var in doc["templating"]["list"]:
        if var["type"] == "query":
            query = var["query"]
            exprs.append(query["query"] if isinstance(query, dict) else query)
    return exprs


def alert_rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(ALERTS.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def used_metric_names() -> set[str]:
    """Every metric name the dashboard and the alerts read; `label_values(m, l)` reads m."""
    names: set[str] = set()
    for expr in dashboard_exprs():
        label_values = re.fullmatch(r"\s*label_values\((.*),\s*\w+\)\s*", expr)
        names |= metric_names(label_values.group(1) if label_values else expr)
    for rule in alert_rules():
        names |= metric_names(rule["expr"])
    return names


def exported_names(exposition: str) -> set[str]:
    """The series names a scrape of `exposition` gives Prometheus, by family type, so a
    histogram or labelled counter with no sample yet still counts as exported."""
    names: set[str] = set()
    for family in text_string_to_metric_families(exposition):
        names |= {s.name for s in family.samples}
        if family.type == "counter":
            names.add(family.name + "_total")
        elif family.type == "histogram":
            names |= {family.name + suffix for suffix in ("_bucket", "_sum", "_count")}
        elif family.type == "summary":
            names |= {family.name, family.name + "_sum", family.name + "_count"}
        else:
            names.add(family.name)
    return names
