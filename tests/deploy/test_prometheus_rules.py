"""deploy/prometheus: the alert rules checked and unit-tested by the real `promtool`, the
example scrape configuration validated by it, and the shape every alert must have.

`promtool` is Debian's `prometheus` package (scripts/bootstrap.sh installs it; nothing
here starts a Prometheus server). That every metric name the rules read is exported by a
running agent, API or router is tests/agent/test_observability_names.py.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from .observability import ALERTS, PROMETHEUS, alert_rules, metric_names

ALERTS_TEST = PROMETHEUS / "alerts_test.yml"
SCRAPE_CONFIG = PROMETHEUS / "prometheus.yml"
SEVERITIES = {"critical", "warning"}
JOBS = {"adapterplane-api", "adapterplane-agent", "adapterplane-router"}


def promtool(*args: str, cwd: Path = PROMETHEUS) -> str:
    binary = shutil.which("promtool")
    if binary is None:
        pytest.fail("promtool is missing: `apt-get install -y --no-install-recommends "
                    "prometheus` brings it (scripts/bootstrap.sh)")
    proc = subprocess.run([binary, *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 0, f"promtool {' '.join(args)}:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def test_rules_are_valid_promql() -> None:
    out = promtool("check", "rules", ALERTS.name)
    assert f"{len(alert_rules())} rules found" in out


def test_rules_unit_tests_pass() -> None:
    assert "SUCCESS" in promtool("test", "rules", ALERTS_TEST.name)


def test_a_wrong_expectation_fails_the_unit_tests(tmp_path: Path) -> None:
    """The unit tests compare labels and rendered annotations: one changed value fails."""
    shutil.copy(ALERTS, tmp_path / ALERTS.name)
    text = ALERTS_TEST.read_text()
    assert "fails 20% of requests" in text
    (tmp_path / ALERTS_TEST.name).write_text(text.replace("fails 20% of requests",
                                                          "fails 21% of requests"))
    binary = shutil.which("promtool")
    if binary is None:
        pytest.fail("promtool is missing (see promtool())")
    proc = subprocess.run([binary, "test", "rules", ALERTS_TEST.name], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode != 0 and "AdapterplaneRouter5xxRate" in proc.stdout + proc.stderr


def test_example_scrape_config_is_valid_and_names_the_jobs() -> None:
    promtool("check", "config", SCRAPE_CONFIG.name)
    doc = yaml.safe_load(SCRAPE_CONFIG.read_text())
    assert {job["job_name"] for job in doc["scrape_configs"]} == JOBS
    assert doc["rule_files"] == [ALERTS.name]


def test_every_alert_has_a_for_a_severity_and_annotations() -> None:
    rules = alert_rules()
    names = [rule["alert"] for rule in rules]
    assert len(names) == len(set(names)) and all(n.startswith("Adapterplane") for n in names)
    for rule in rules:
        assert rule.get("for"), rule["alert"]
        assert rule["labels"]["severity"] in SEVERITIES, rule["alert"]
        annotations = rule["annotations"]
        assert annotations["summary"].strip() and annotations["description"].strip(), rule
    jobs = {job for rule in rules
            for job in re.findall(r'job="([^"]+)"', rule["expr"])}
    assert jobs <= JOBS, jobs - JOBS


def test_the_failure_families_are_covered() -> None:
    """Agents down or silent, load failures, wrong-generation refusals, the validation
    backlog (depth and age), propagation lag and the 5xx rates of the three components."""
    reads = {rule["alert"]: metric_names(rule["expr"]) for rule in alert_rules()}
    needed = {"up", "adapterplane_agent_heartbeat_age_seconds", "adapter_load_attempts_total",
              "adapter_slot_generation_mismatch_total", "adapterplane_jobs_queued",
              "adapterplane_jobs_oldest_queued_age_seconds",
              "adapterplane_agent_catalog_lag_seconds", "adapterplane_api_requests_total",
              "adapter_requests_rejected_total", "adapterplane_router_requests_total"}
    assert needed <= set().union(*reads.values()), needed - set().union(*reads.values())


def test_every_alert_fires_in_one_case_and_not_in_another() -> None:
    doc = yaml.safe_load(ALERTS_TEST.read_text())
    assert doc["rule_files"] == [ALERTS.name]
    firing: set[str] = set()
    quiet: set[str] = set()
    for case in doc["tests"]:
        for check in case.get("alert_rule_test", []):
            (firing if check.get("exp_alerts") else quiet).add(check["alertname"])
    names = {rule["alert"] for rule in alert_rules()}
    assert firing == names, names ^ firing
    assert quiet == names, names ^ quiet


@pytest.mark.parametrize(("expr", "names"), [
    ('up{job="adapterplane-agent"} == 0', {"up"}),
    ('histogram_quantile(0.99, sum by (le, route) (rate(x_seconds_bucket{route=~"/v1/.+"}'
     '[$__rate_interval])))', {"x_seconds_bucket"}),
    ('sum by (instance) (rate(a_total{reason=~"engine_error|b"}[5m])) / on (instance) '
     'group_left (job) max without (instance, le) (b_gauge offset 1h) > bool 0.05 '
     'and c:recorded:rate5m', {"a_total", "b_gauge", "c:recorded:rate5m"}),
    ('max(x) or vector(0) unless absent(y{a="}"}) + 1e3 * inf', {"x", "y"}),
    ('rate(a[5m:30s]) - ignoring (x) b', {"a", "b"}),
])
def test_metric_names_of_promql(expr: str, names: set[str]) -> None:
    assert metric_names(expr) == names
