"""Static checks of the deploy artefacts: no Docker engine or cluster is needed.

The compose file, the Kubernetes manifests, the alert rules and the dashboard must agree with
each other and with the interfaces in docs/design.md and leap_stream/settings.py; when they drift,
these tests fail instead of a deployment failing at 3 a.m.
"""

from __future__ import annotations

import ast
import base64
import fnmatch
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from leap_stream import settings as config
from leap_stream.stream.submission_loop import submissions_group

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
COMPOSE = ROOT / "docker-compose.yml"
ALERTS = DEPLOY / "prometheus" / "alerts.yml"
# promtool's unit tests of the alerts: every minute, and over a week every 10 minutes
ALERTS_TESTS = (
    DEPLOY / "prometheus" / "alerts_test.yml",
    DEPLOY / "prometheus" / "alerts_test_week.yml",
)
PROMETHEUS_YML = DEPLOY / "prometheus" / "prometheus.yml"
DASHBOARD = DEPLOY / "grafana" / "leap-stream.json"
DATASOURCES = DEPLOY / "grafana" / "provisioning" / "datasources" / "prometheus.yml"
DASHBOARD_PROVIDERS = DEPLOY / "grafana" / "provisioning" / "dashboards" / "leap-stream.yml"
DOCKERFILE = DEPLOY / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
OPERATIONS = ROOT / "docs" / "operations.md"
SECURITY = ROOT / "docs" / "security.md"
DESIGN = ROOT / "docs" / "design.md"

SETTINGS = {s.env for s in config.SETTINGS}
YAML_FILES = sorted([COMPOSE, *DEPLOY.rglob("*.yml"), *DEPLOY.rglob("*.yaml")])


def load(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def load_all(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


# --------------------------------------------------------------------------- design metrics


def design_metrics() -> dict[str, str]:
    """Metric name -> 'histogram' or 'other', from the Metrics block of docs/design.md."""
    text = DESIGN.read_text()
    section = text.split("## Metrics", 1)[1]
    block = section.split("```", 2)[1]
    metrics: dict[str, str] = {}
    for line in block.splitlines():
        m = re.match(r"\s*(leap_[a-z0-9_]+)", line)
        if m:
            metrics[m.group(1)] = "histogram" if "histogram" in line else "other"
    return metrics


# Series Prometheus itself creates for every scrape target.
SYNTHETIC_SERIES = {"up"}

PROMQL_WORDS = {
    "and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring",
    "group_left", "group_right", "inf", "nan",
}  # fmt: skip


def promql_metric_names(expr: str) -> set[str]:
    """Metric names a PromQL expression selects (functions, labels, keywords removed)."""
    s = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    s = re.sub(r"\{[^}]*\}", " ", s)
    s = re.sub(r"\[[^\]]*\]", " ", s)
    s = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", s)
    s = re.sub(r"\$\{?\w+\}?", " ", s)
    s = re.sub(r"(?<![\w:])\d+(\.\d+)?([eE][-+]?\d+)?[smhdwy]?\b", " ", s)
    names = set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", s):
        if s[m.end() :].lstrip().startswith("("):
            continue  # a function or an aggregation operator
        if m.group(0).lower() in PROMQL_WORDS:
            continue
        names.add(m.group(0))
    return names


def unknown_metrics(names: set[str]) -> set[str]:
    known = design_metrics()
    bad = set()
    for name in names:
        if name in known or name in SYNTHETIC_SERIES:
            continue
        base = re.sub(r"_(bucket|sum|count)$", "", name)
        if base != name and known.get(base) == "histogram":
            continue
        bad.add(name)
    return bad


def test_design_lists_the_metrics_the_artefacts_rely_on() -> None:
    metrics = design_metrics()
    assert metrics["leap_ranking_latency_seconds"] == "histogram"
    assert {"leap_consumer_lag", "leap_coverage_ratio", "leap_model_age_seconds"} <= set(metrics)


def test_promql_metric_name_extraction() -> None:
    expr = (
        'sum by (le) (rate(leap_x_seconds_bucket{source!="none", le="+Inf"}[5m])) / '
        "clamp_min(up, 1e-9) > 36 * 3600 and on (topic) leap_y offset 5m"
    )
    assert promql_metric_names(expr) == {"leap_x_seconds_bucket", "up", "leap_y"}
    assert unknown_metrics({"leap_ranking_latency_seconds_bucket", "up"}) == set()
    assert unknown_metrics({"leap_consumer_lag_bucket", "leap_not_a_metric"}) == {
        "leap_consumer_lag_bucket",
        "leap_not_a_metric",
    }


# --------------------------------------------------------------------------- promtool


def promtool() -> str:
    """Path of promtool; in CI a missing promtool is a failure, locally a skip."""
    path = shutil.which("promtool")
    if path:
        return path
    message = "promtool not installed (Debian package: prometheus)"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(message)
    pytest.skip(message)


def run_promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [promtool(), *args], capture_output=True, text=True, timeout=120, cwd=cwd, check=False
    )


# --------------------------------------------------------------------------- YAML


@pytest.mark.parametrize("path", YAML_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_yaml_parses(path: Path) -> None:
    docs = load_all(path)
    assert docs, f"{path} is empty"
    assert all(isinstance(d, dict) for d in docs)


def test_yaml_files_found() -> None:
    names = {p.name for p in YAML_FILES}
    assert {"docker-compose.yml", "alerts.yml", "prometheus.yml", "kustomization.yaml"} <= names


# --------------------------------------------------------------------------- compose


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data: dict[str, Any] = load(COMPOSE)
    return data


def service_env(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment", {})
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {k: str(v) for k, v in env.items()}


def workers(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {
        name: svc for name, svc in compose["services"].items() if svc.get("command") == ["worker"]
    }


def test_compose_has_the_stack(compose: dict[str, Any]) -> None:
    services = compose["services"]
    for name in ("kafka", "topics", "redis", "trainer", "prometheus", "grafana"):
        assert name in services, name
    assert services["kafka"]["image"].startswith("apache/kafka:")
    assert services["topics"]["command"] == ["topics", "create"]
    assert services["topics"]["restart"] == "no"


def test_compose_kafka_is_single_node_kraft(compose: dict[str, Any]) -> None:
    env = service_env(compose["services"]["kafka"])
    assert set(env["KAFKA_PROCESS_ROLES"].split(",")) == {"broker", "controller"}
    node = env["KAFKA_NODE_ID"]
    assert env["KAFKA_CONTROLLER_QUORUM_VOTERS"].startswith(f"{node}@kafka:")
    assert "CONTROLLER" in env["KAFKA_CONTROLLER_LISTENER_NAMES"]
    assert env["KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR"] == "1"
    assert env["KAFKA_AUTO_CREATE_TOPICS_ENABLE"] == "false"  # `topics` creates them
    # KRaft storage format needs a cluster id that is a Kafka Uuid: 16 bytes, base64url, 22 chars
    cluster_id = env["CLUSTER_ID"]
    assert len(cluster_id) == 22
    assert len(base64.urlsafe_b64decode(cluster_id + "==")) == 16
    assert "healthcheck" in compose["services"]["kafka"]


def test_compose_two_workers_share_one_consumer_group(compose: dict[str, Any]) -> None:
    found = workers(compose)
    assert len(found) >= 2, "partition scaling needs at least two workers"
    envs = [service_env(svc) for svc in found.values()]
    default_group = config.Settings.from_env({}).consumer_group
    groups = {env.get("LEAP_CONSUMER_GROUP", default_group) for env in envs}
    assert len(groups) == 1
    assert {env["LEAP_KAFKA_BOOTSTRAP"] for env in envs} == {"kafka:9092"}
    for name, svc in found.items():
        deps = svc["depends_on"]
        assert deps["kafka"]["condition"] == "service_healthy", name
        assert deps["redis"]["condition"] == "service_healthy", name
        assert deps["topics"]["condition"] == "service_completed_successfully", name
        assert "/healthz" in " ".join(svc["healthcheck"]["test"]), name


def test_compose_env_uses_only_documented_settings(compose: dict[str, Any]) -> None:
    for name, svc in compose["services"].items():
        for key in service_env(svc):
            if key.startswith("LEAP_") and key != "LEAP_IMAGE_TAG":
                assert key in SETTINGS, f"{name}: {key} is not in leap_stream/settings.py"


def volume_sources(svc: dict[str, Any]) -> dict[str, str]:
    """Container path -> volume name or host path (':ro' suffix kept in the value)."""
    out = {}
    for spec in svc.get("volumes", []):
        source, target, *mode = spec.split(":")
        out[target] = source + (":" + mode[0] if mode else "")
    return out


def test_compose_trainer_shares_dataset_and_registry(compose: dict[str, Any]) -> None:
    trainer = compose["services"]["trainer"]
    script = " ".join(trainer["command"])
    assert "leap-stream train --dataset /data/dataset --registry /data/registry" in script
    assert "sleep" in script and "86400" in str(trainer["environment"]["TRAIN_INTERVAL_S"])
    t_vols = volume_sources(trainer)
    assert t_vols["/data/registry"] == "registry"  # the trainer publishes models
    for name, svc in workers(compose).items():
        w_vols = volume_sources(svc)
        assert w_vols["/data/dataset"] == "dataset", name  # the completion sink writes
        assert w_vols["/data/registry"].split(":")[0] == "registry", name
    assert {"dataset", "registry"} <= set(compose["volumes"])


def test_compose_bind_mounts_exist(compose: dict[str, Any]) -> None:
    for name, svc in compose["services"].items():
        for source in volume_sources(svc).values():
            path = source.split(":")[0]
            if path.startswith("./"):
                assert (ROOT / path).exists(), f"{name}: {path} missing"


def test_compose_prometheus_scrapes_every_worker(compose: dict[str, Any]) -> None:
    prom = load(PROMETHEUS_YML)
    jobs = {job["job_name"]: job for job in prom["scrape_configs"]}
    targets = {t for sc in jobs["leap-stream-worker"]["static_configs"] for t in sc["targets"]}
    expected = {
        f"{svc.get('hostname', name)}:{service_env(svc)['LEAP_METRICS_PORT']}"
        for name, svc in workers(compose).items()
    }
    assert targets == expected
    assert prom["rule_files"] == ["alerts.yml"]
    mounts = volume_sources(compose["services"]["prometheus"])
    assert mounts["/etc/prometheus/alerts.yml"].startswith("./deploy/prometheus/alerts.yml")


def test_compose_grafana_provisioning_matches_mounts(compose: dict[str, Any]) -> None:
    mounts = volume_sources(compose["services"]["grafana"])
    assert mounts["/etc/grafana/provisioning"].startswith("./deploy/grafana/provisioning")
    provider = load(DASHBOARD_PROVIDERS)["providers"][0]
    dash_dir = provider["options"]["path"]
    assert mounts[f"{dash_dir}/leap-stream.json"].startswith("./deploy/grafana/leap-stream.json")
    assert compose["services"]["grafana"]["depends_on"]["prometheus"]["condition"] == (
        "service_healthy"
    )


def test_compose_publishes_on_loopback_with_passwords_from_the_environment(
    compose: dict[str, Any],
) -> None:
    """Kafka's host listener is PLAINTEXT, Redis and Grafana hold the history and dashboards:
    nothing may listen on another machine's reach, and no password has a default."""
    published = 0
    for name, svc in compose["services"].items():
        for port in svc.get("ports", []):
            published += 1
            assert str(port).startswith("127.0.0.1:"), f"{name} publishes {port} on every interface"
    assert published >= 4
    redis = compose["services"]["redis"]
    assert "--requirepass" in " ".join(redis["command"])
    password = service_env(redis)["REDIS_PASSWORD"]
    assert password.startswith("${LEAP_REDIS_PASSWORD:?")
    for name, svc in workers(compose).items():
        assert service_env(svc)["LEAP_REDIS_PASSWORD"].startswith("${LEAP_REDIS_PASSWORD:?"), name
        assert service_env(svc)["LEAP_METRICS_ADDR"] == "0.0.0.0"
        assert not svc.get("ports"), f"{name}: /metrics is for the compose network only"
    grafana = service_env(compose["services"]["grafana"])
    assert grafana["GF_SECURITY_ADMIN_PASSWORD"].startswith("${GRAFANA_ADMIN_PASSWORD:?")


def test_compose_services_have_healthchecks(compose: dict[str, Any]) -> None:
    for name, svc in compose["services"].items():
        check = svc.get("healthcheck")
        one_shot = svc.get("restart") == "no" or name == "trainer"
        if one_shot:
            assert check == {"disable": True}, f"{name} must not inherit the /metrics check"
        else:
            assert check and check.get("test"), f"{name} has no healthcheck"


# --------------------------------------------------------------------------- Dockerfile


def dockerfile_stages() -> list[tuple[str, list[str]]]:
    """(base image with ARG defaults substituted, instruction lines) per stage."""
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    args: dict[str, str] = {}
    stages: list[tuple[str, list[str]]] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if not stages and line.startswith("ARG "):
            name, _, default = line[4:].partition("=")
            args[name.strip()] = default.strip()
        if line.startswith("FROM "):
            image = line.split()[1]
            image = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], image)
            stages.append((image, []))
        elif stages:
            stages[-1][1].append(line)
    return stages


def test_dockerfile_is_multistage_on_documented_slim_python() -> None:
    stages = dockerfile_stages()
    assert len(stages) >= 2
    documented = re.search(r"base image: `([^`]+)`", OPERATIONS.read_text())
    assert documented, "docs/operations.md must name the base image"
    for image, _lines in stages:
        assert image == documented.group(1)
        assert image.startswith("python:3.11-slim")


def test_dockerfile_runtime_is_lean_non_root_with_entrypoint() -> None:
    (_b, builder), (_r, runtime) = dockerfile_stages()[0], dockerfile_stages()[-1]
    run = " ".join(line for line in runtime if line.startswith("RUN "))
    assert "libgomp1" in run
    for tool in ("build-essential", "gcc", "g++", "make ", "git"):
        assert tool not in run, f"{tool} in the runtime stage"
    assert any("pip wheel" in line for line in builder)
    assert "--no-index" in run, "the runtime must install only the built wheels"
    users = [line.split()[1] for line in runtime if line.startswith("USER ")]
    assert users, "no USER in the runtime stage"
    uid = users[-1].split(":")[0]
    assert uid not in ("0", "root")
    assert f"--uid {uid}" in run
    documented_uid = re.search(r"uid `(\d+)`", OPERATIONS.read_text())
    assert documented_uid and documented_uid.group(1) == uid
    entry = [line for line in runtime if line.startswith("ENTRYPOINT ")]
    assert entry and json.loads(entry[-1][len("ENTRYPOINT ") :]) == ["leap-stream"]
    health = [line for line in runtime if line.startswith("HEALTHCHECK ")]
    assert health and "/metrics" in health[-1] and "LEAP_METRICS_PORT" in health[-1]


def test_dockerfile_copies_exist_and_dockerignore_keeps_them() -> None:
    builder = dockerfile_stages()[0][1]
    patterns = [
        p.strip().rstrip("/")
        for p in DOCKERIGNORE.read_text().splitlines()
        if p.strip() and not p.startswith("#")
    ]
    assert ".venv" in patterns and ".git" in patterns
    copied = [
        src
        for line in builder
        if line.startswith("COPY ") and "--from" not in line
        for src in line.split()[1:-1]
    ]
    assert {"pyproject.toml", "leap_stream", "schemas"} <= set(copied)
    for src in copied:
        assert (ROOT / src).exists(), src
        for pat in patterns:
            assert not fnmatch.fnmatch(src, pat), f".dockerignore {pat!r} drops {src}"
    # the image must carry the package data (catalog) and the schemas
    for data in ("leap_stream/catalog/hardware.json", "schemas/job-submitted.schema.json"):
        for pat in patterns:
            assert not fnmatch.fnmatch(data, pat), f".dockerignore {pat!r} drops {data}"


# third-party modules the package imports that the image need not carry, and the one file
# that imports each: it says how to get the module when it is missing (test_bench.py pins it)
DEV_ONLY_IMPORTS = {"pyinstrument": "leap_stream/tools/bench/cli.py"}


def _dist_name(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()  # PEP 503


def _requirement_names(requirements: list[str]) -> set[str]:
    names = (re.match(r"[A-Za-z0-9._-]+", r) for r in requirements)
    return {_dist_name(m.group(0)) for m in names if m}


def _third_party_imports() -> dict[str, set[str]]:
    """Top-level module → the package files that import it (lazily, inside a function, too)."""
    found: dict[str, set[str]] = {}
    for path in sorted((ROOT / "leap_stream").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [node.module]
            else:
                continue
            for top in {n.split(".")[0] for n in names}:
                if top not in sys.stdlib_module_names and top != "leap_stream":
                    found.setdefault(top, set()).add(path.relative_to(ROOT).as_posix())
    return found


def test_the_image_installs_every_module_the_package_imports() -> None:
    """What the image installs (`leap-stream[<extra>]`, DOCKERFILE) names every third-party
    module the service imports as a dependency of its own, and the `tools` extra adds what
    only `leap_stream/tools/` imports; the service's install pulls nothing of the tools'
    alone (matplotlib). A lazily imported module that is missing fails only when the command
    that needs it runs (the Kueue gate's HTTP client was in the dev extra alone), and one that
    arrives through another package's dependencies can go with that package's next release."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extra = re.search(r'"leap-stream\[(\w+)\]"', DOCKERFILE.read_text())
    assert extra, "the Dockerfile no longer installs leap-stream[<extra>]"
    extras = project["optional-dependencies"]
    service = _requirement_names(project["dependencies"] + extras[extra.group(1)])
    tools = service | _requirement_names(extras["tools"])
    assert "matplotlib" not in service and "matplotlib" in tools
    providers = importlib.metadata.packages_distributions()
    imports = _third_party_imports()
    assert {"numpy", "httpx", "lleaves", "matplotlib"} <= set(imports)  # lazy imports too
    missing: dict[str, list[str]] = {}
    for module, files in imports.items():
        if module in DEV_ONLY_IMPORTS:
            assert files == {DEV_ONLY_IMPORTS[module]}, f"{module} is imported elsewhere too"
            continue
        dists = {_dist_name(d) for d in providers.get(module, [module])}
        only_tools = all(f.startswith("leap_stream/tools/") for f in files)
        if not dists & (tools if only_tools else service):
            missing[module] = sorted(files)
    assert not missing, f"imported but not a dependency of leap-stream[{extra.group(1)}]: {missing}"


# --------------------------------------------------------------------------- Kubernetes


@pytest.fixture(scope="module")
def k8s() -> list[dict[str, Any]]:
    docs = []
    for path in sorted(K8S.glob("*.yaml")):
        if path.name != "kustomization.yaml":
            docs.extend(load_all(path))
    return docs


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = by_kind(docs, kind)
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


def pod_specs(docs: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    for d in docs:
        name = f"{d['kind']}/{d['metadata']['name']}"
        if d["kind"] in ("Deployment", "Job"):
            yield name, d["spec"]["template"]["spec"]
        elif d["kind"] == "CronJob":
            yield name, d["spec"]["jobTemplate"]["spec"]["template"]["spec"]


def test_k8s_required_kinds(k8s: list[dict[str, Any]]) -> None:
    kinds = {d["kind"] for d in k8s}
    required = {
        "Namespace", "ConfigMap", "Secret", "Deployment", "Service", "ScaledObject",
        "TriggerAuthentication", "CronJob", "PersistentVolumeClaim", "NetworkPolicy",
    }  # fmt: skip
    assert required <= kinds, required - kinds


def test_k8s_network_policy_admits_only_metrics_to_the_workers(k8s: list[dict[str, Any]]) -> None:
    policies = [d for d in k8s if d["kind"] == "NetworkPolicy"]
    deny = [p for p in policies if p["spec"]["podSelector"] == {} and not p["spec"].get("ingress")]
    assert deny and "Ingress" in deny[0]["spec"]["policyTypes"]  # default deny for every pod
    allow = [p for p in policies if p["spec"].get("ingress")]
    worker = one(k8s, "Deployment")["spec"]["template"]["metadata"]["labels"]
    for p in allow:
        assert p["spec"]["podSelector"]["matchLabels"].items() <= worker.items()
        for rule in p["spec"]["ingress"]:
            assert [port["port"] for port in rule["ports"]] == ["metrics"]
            assert all("namespaceSelector" in f or "podSelector" in f for f in rule["from"])
    cm = one(k8s, "ConfigMap")["data"]
    assert cm["LEAP_METRICS_ADDR"] == "0.0.0.0"  # the pod interface, behind the policy


def test_k8s_kustomization_lists_every_manifest() -> None:
    kust = load(K8S / "kustomization.yaml")
    files = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kust["resources"]) == files
    assert kust["namespace"] == "leap-stream"


def test_k8s_everything_in_the_namespace(k8s: list[dict[str, Any]]) -> None:
    ns = one(k8s, "Namespace")["metadata"]["name"]
    for d in k8s:
        if d["kind"] != "Namespace":
            assert d["metadata"]["namespace"] == ns, d["metadata"]["name"]


def test_k8s_pods_are_non_root_read_only(k8s: list[dict[str, Any]]) -> None:
    specs = dict(pod_specs(k8s))
    assert {"Deployment/leap-stream-worker", "CronJob/leap-stream-retrain"} <= set(specs)
    for name, spec in specs.items():
        pod_sc = spec["securityContext"]
        assert pod_sc["runAsNonRoot"] is True, name
        assert pod_sc["runAsUser"] != 0, name
        assert spec.get("automountServiceAccountToken") is False, name
        volumes = {v["name"] for v in spec.get("volumes", [])}
        for c in spec["containers"]:
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False, name
            assert sc["readOnlyRootFilesystem"] is True, name
            assert sc["capabilities"]["drop"] == ["ALL"], name
            assert c["resources"]["requests"] and c["resources"]["limits"]["memory"], name
            mounts = {m["mountPath"]: m["name"] for m in c.get("volumeMounts", [])}
            assert "/tmp" in mounts, f"{name}: read-only root needs a writable /tmp"
            assert set(mounts.values()) <= volumes, name


def test_k8s_uid_matches_image(k8s: list[dict[str, Any]]) -> None:
    runtime = dockerfile_stages()[-1][1]
    user = [line.split()[1] for line in runtime if line.startswith("USER ")][-1]
    uid = int(user.split(":")[0])
    for name, spec in pod_specs(k8s):
        assert spec["securityContext"]["runAsUser"] == uid, name


def test_k8s_worker_probes_and_ports(k8s: list[dict[str, Any]]) -> None:
    cm = one(k8s, "ConfigMap")["data"]
    port = int(cm["LEAP_METRICS_PORT"])
    deploy = one(k8s, "Deployment")
    (c,) = deploy["spec"]["template"]["spec"]["containers"]
    assert c["args"] == ["worker"]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports["metrics"] == port
    paths = {"livenessProbe": "/healthz", "readinessProbe": "/readyz", "startupProbe": "/healthz"}
    for probe, path in paths.items():
        http = c[probe]["httpGet"]
        assert http["path"] == path and http["port"] in ("metrics", port), probe
    svc = one(k8s, "Service")
    assert svc["spec"]["selector"] == deploy["spec"]["selector"]["matchLabels"]
    assert svc["spec"]["ports"][0]["targetPort"] in ("metrics", port)
    assert svc["metadata"]["name"] == "leap-stream-worker"  # job label the alerts expect


def test_k8s_config_and_secret_use_documented_settings(k8s: list[dict[str, Any]]) -> None:
    cm = one(k8s, "ConfigMap")
    secret = next(
        s for s in by_kind(k8s, "Secret") if s["metadata"]["name"] == "leap-stream-secrets"
    )
    for key in [*cm["data"], *secret["stringData"]]:
        if key.startswith("LEAP_"):
            assert key in SETTINGS, key
    for key in ("LEAP_KAFKA_SASL_PASSWORD", "LEAP_REDIS_PASSWORD"):
        assert key not in cm["data"], f"{key} is a secret"
        assert secret["stringData"][key] == "CHANGE-ME", "only placeholders are committed"
    names = {d["metadata"]["name"] for d in k8s}
    for name, spec in pod_specs(k8s):
        for c in spec["containers"]:
            for ref in c.get("envFrom", []):
                target = ref.get("configMapRef") or ref.get("secretRef")
                assert target["name"] in names, name
        for vol in spec.get("volumes", []):
            if "persistentVolumeClaim" in vol:
                assert vol["persistentVolumeClaim"]["claimName"] in names, name
            if "secret" in vol:
                assert vol["secret"]["secretName"] in names, name


def test_k8s_pvcs_are_read_write_many(k8s: list[dict[str, Any]]) -> None:
    pvcs = {p["metadata"]["name"]: p for p in by_kind(k8s, "PersistentVolumeClaim")}
    assert {"leap-stream-dataset", "leap-stream-registry"} <= set(pvcs)
    for name, pvc in pvcs.items():
        assert pvc["spec"]["accessModes"] == ["ReadWriteMany"], name


def test_k8s_keda_scales_on_lag_up_to_partitions(k8s: list[dict[str, Any]]) -> None:
    cm = one(k8s, "ConfigMap")["data"]
    so = one(k8s, "ScaledObject")
    deploy = one(k8s, "Deployment")
    assert so["spec"]["scaleTargetRef"]["name"] == deploy["metadata"]["name"]
    assert so["spec"]["maxReplicaCount"] == int(cm["LEAP_TOPIC_PARTITIONS"])
    assert 1 <= so["spec"]["minReplicaCount"] <= so["spec"]["maxReplicaCount"]
    triggers = so["spec"]["triggers"]
    assert triggers and all(t["type"] == "kafka" for t in triggers)
    topics = set()
    auth = one(k8s, "TriggerAuthentication")
    for t in triggers:
        md = t["metadata"]
        assert int(md["lagThreshold"]) > 0
        # the group that commits this topic (stream/lag.py worker_groups, as the worker)
        group = cm["LEAP_CONSUMER_GROUP"]
        if md["topic"] == cm["LEAP_TOPIC_SUBMISSIONS"]:
            group = submissions_group(group)
        assert md["consumerGroup"] == group, md["topic"]
        assert md["bootstrapServers"] == cm["LEAP_KAFKA_BOOTSTRAP"]
        assert t["authenticationRef"]["name"] == auth["metadata"]["name"]
        topics.add(md["topic"])
    assert topics == {cm["LEAP_TOPIC_SUBMISSIONS"], cm["LEAP_TOPIC_COMPLETIONS"]}
    secrets = {s["metadata"]["name"]: s["stringData"] for s in by_kind(k8s, "Secret")}
    for ref in auth["spec"]["secretTargetRef"]:
        assert ref["key"] in secrets[ref["name"]], ref


def test_k8s_nightly_retrain_cronjob(k8s: list[dict[str, Any]]) -> None:
    cron = one(k8s, "CronJob")
    assert len(cron["spec"]["schedule"].split()) == 5
    assert cron["spec"]["concurrencyPolicy"] == "Forbid"
    (c,) = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
    assert c["args"][0] == "train"
    args = dict(zip(c["args"][1::2], c["args"][2::2], strict=True))
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    assert mounts[args["--dataset"]].get("readOnly") is True
    assert not mounts[args["--registry"]].get("readOnly")
    spec = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    claims = {
        v["name"]: v["persistentVolumeClaim"]["claimName"]
        for v in spec["volumes"]
        if "persistentVolumeClaim" in v
    }
    assert claims[mounts[args["--registry"]]["name"]] == "leap-stream-registry"
    assert claims[mounts[args["--dataset"]]["name"]] == "leap-stream-dataset"


def test_k8s_kustomize_builds() -> None:
    kubectl = shutil.which("kubectl")
    if not kubectl:
        pytest.skip("kubectl not installed; the pure checks above still ran")
    out = subprocess.run(
        [kubectl, "kustomize", str(K8S)], capture_output=True, text=True, timeout=120, check=False
    )
    assert out.returncode == 0, out.stderr
    kinds = {d["kind"] for d in yaml.safe_load_all(out.stdout) if d}
    assert {"Deployment", "ScaledObject", "CronJob"} <= kinds


# --------------------------------------------------------------------------- alerts


@pytest.fixture(scope="module")
def rules() -> list[dict[str, Any]]:
    return [r for g in load(ALERTS)["groups"] for r in g["rules"]]


def heading_anchors(path: Path) -> set[str]:
    anchors = set()
    for line in path.read_text().splitlines():
        m = re.match(r"#{1,6}\s+(.*)", line)
        if m:
            slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
            anchors.add(slug)
    return anchors


def test_alerts_cover_the_required_conditions(rules: list[dict[str, Any]]) -> None:
    exprs = {r["alert"]: " ".join(r["expr"].split()) for r in rules}

    def find(pattern: str) -> str:
        hits = [name for name, e in exprs.items() if re.search(pattern, e)]
        assert hits, f"no alert matches {pattern!r}"
        return hits[0]

    find(r"^sum by \(topic\) \(max by \(topic, partition\) \(leap_consumer_lag\)\) > \d+$")
    find(r"deriv\(leap_consumer_lag\[15m\]\)")
    find(r"leap_rankings_out_total\{source!=\"none\"\}.*< 0\.95")
    find(r"leap_model_age_seconds\) > 36 \* 3600")
    find(r"leap_dead_letter_total")
    find(r"leap_redis_errors_total")
    find(r'up\{job="leap-stream-worker"\} == 0')


def test_alerts_are_well_formed(rules: list[dict[str, Any]]) -> None:
    anchors = heading_anchors(OPERATIONS)
    names = [r["alert"] for r in rules]
    assert len(names) == len(set(names))
    for r in rules:
        name = r["alert"]
        assert re.fullmatch(r"\d+[smh]", r["for"]), name
        assert r["labels"]["severity"] in {"warning", "critical"}, name
        ann = r["annotations"]
        assert ann["summary"] and ann["description"], name
        doc, _, anchor = ann["runbook"].partition("#")
        assert doc == "docs/operations.md" and anchor == name.lower(), name
        assert anchor in anchors, f"{name}: no runbook section in docs/operations.md"


def test_alerts_use_only_design_metrics(rules: list[dict[str, Any]]) -> None:
    for r in rules:
        names = promql_metric_names(r["expr"])
        assert names, r["alert"]
        assert not unknown_metrics(names), (r["alert"], unknown_metrics(names))


def test_promtool_checks_rules_and_config() -> None:
    out = run_promtool("check", "rules", str(ALERTS))
    assert out.returncode == 0, out.stdout + out.stderr
    out = run_promtool("check", "config", PROMETHEUS_YML.name, cwd=PROMETHEUS_YML.parent)
    assert out.returncode == 0, out.stdout + out.stderr


def test_promtool_alert_unit_tests(tmp_path: Path, rules: list[dict[str, Any]]) -> None:
    """Each alert fires on the bad series in its promtool unit tests and stays quiet on healthy
    ones."""
    firing = {
        case["alertname"]
        for path in ALERTS_TESTS
        for t in load(path)["tests"]
        for case in t.get("alert_rule_test", [])
        if case.get("exp_alerts")
    }
    assert firing == {r["alert"] for r in rules}, "every alert needs a firing unit test"
    stripped = load(ALERTS)
    for group in stripped["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)  # the wording is not under test; thresholds are
    (tmp_path / "alerts.yml").write_text(yaml.safe_dump(stripped))
    for path in ALERTS_TESTS:
        shutil.copy(path, tmp_path / path.name)
    out = run_promtool("test", "rules", *(path.name for path in ALERTS_TESTS), cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr


# --------------------------------------------------------------------------- dashboard


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return data


def all_panels(dash: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for p in dash["panels"]:
        out.append(p)
        out.extend(p.get("panels", []))
    return out


def dashboard_exprs(dash: dict[str, Any]) -> list[tuple[str, str]]:
    return [(p["title"], t["expr"]) for p in all_panels(dash) for t in p.get("targets", [])]


def test_dashboard_panel_ids_unique_and_layout_fits(dashboard: dict[str, Any]) -> None:
    panels = all_panels(dashboard)
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    cells: dict[tuple[int, int], str] = {}
    for p in panels:
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24, p["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{p['title']} overlaps {cells[(x, y)]}"
                cells[(x, y)] = p["title"]


def test_dashboard_datasource_uid_is_the_provisioned_one(dashboard: dict[str, Any]) -> None:
    (ds,) = load(DATASOURCES)["datasources"]
    assert ds["type"] == "prometheus"
    seen = set()
    for p in all_panels(dashboard):
        if p["type"] == "row":
            continue
        seen.add(p["datasource"]["uid"])
        seen.update(t["datasource"]["uid"] for t in p["targets"])
    assert seen == {ds["uid"]}


def test_dashboard_uses_only_design_metrics(dashboard: dict[str, Any]) -> None:
    exprs = dashboard_exprs(dashboard)
    assert exprs
    for title, expr in exprs:
        names = promql_metric_names(expr)
        assert names, title
        assert not unknown_metrics(names), (title, unknown_metrics(names))


def test_dashboard_shows_what_operators_need(dashboard: dict[str, Any]) -> None:
    text = " ".join(" ".join(e.split()) for _t, e in dashboard_exprs(dashboard))
    for needle in (
        "max by (topic, partition) (leap_consumer_lag)",
        "leap_events_in_total",
        "leap_rankings_out_total",
        "histogram_quantile(0.5, sum by (le) (rate(leap_ranking_latency_seconds_bucket",
        "histogram_quantile(0.99, sum by (le) (rate(leap_ranking_latency_seconds_bucket",
        "leap_coverage_ratio",
        "sum by (reason) (rate(leap_fallback_total",
        "leap_dead_letter_total",
        "leap_model_info",
        "leap_model_age_seconds",
        "leap_redis_errors_total",
    ):
        assert needle in text, needle


def test_dashboard_queries_parse(tmp_path: Path, dashboard: dict[str, Any]) -> None:
    """promtool has no query linter; recording rules with the same expressions are parsed."""
    rules = [
        {"record": f"leap:dashboard_check_{i}", "expr": expr.replace("$__rate_interval", "5m")}
        for i, (_title, expr) in enumerate(dashboard_exprs(dashboard))
    ]
    path = tmp_path / "dashboard_rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    out = run_promtool("check", "rules", str(path))
    assert out.returncode == 0, out.stdout + out.stderr


# --------------------------------------------------------------------------- docs


def test_docs_name_the_settings_they_configure() -> None:
    ops, sec = OPERATIONS.read_text(), SECURITY.read_text()
    for env in re.findall(r"`(LEAP_[A-Z0-9_]+)", ops + sec):
        assert env in SETTINGS, f"docs mention {env}, which settings.py does not define"
    for env in (
        "LEAP_KAFKA_SECURITY_PROTOCOL",
        "LEAP_KAFKA_SASL_MECHANISM",
        "LEAP_KAFKA_SASL_PASSWORD",
        "LEAP_KAFKA_SSL_CAFILE",
        "LEAP_REDIS_URL",
        "LEAP_REDIS_PASSWORD",
        "LEAP_DLQ_RETENTION_MS",
    ):
        assert env in sec, f"docs/security.md does not cover {env}"


def test_the_configuration_table_is_generated_from_the_settings() -> None:
    text = (ROOT / "docs" / "configuration.md").read_text()
    assert config.config_table_markdown() in text, (
        "docs/configuration.md is stale: leap-stream config --markdown"
    )


# --------------------------------------------------------------------------- Kueue gate


def test_kueue_gate_manifests_are_minimal_and_marked_untested() -> None:
    folder = K8S / "kueue"
    kust = load(folder / "kustomization.yaml")
    files = {p.name for p in folder.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kust["resources"]) == files
    assert "UNTESTED AGAINST A LIVE CLUSTER" in (folder / "kustomization.yaml").read_text()
    docs = [d for f in sorted(files) for d in load_all(folder / f)]
    [role] = by_kind(docs, "ClusterRole")
    assert role["rules"] == [
        {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["list", "patch"]}
    ]
    deployments = {d["metadata"]["name"]: d for d in by_kind(docs, "Deployment")}
    gate = deployments["leap-stream-kueue-gate"]["spec"]["template"]["spec"]
    assert gate["serviceAccountName"] == "leap-stream-kueue-gate"
    assert gate["containers"][0]["args"][0] == "kueue-gate"
    serve = deployments["leap-stream-serve"]["spec"]["template"]["spec"]["containers"][0]
    assert serve["args"] == ["serve"]
    assert serve["readinessProbe"]["httpGet"]["path"] == "/readyz"
    from leap_stream.cli import COMMANDS

    assert "kueue-gate" in COMMANDS and "serve" in COMMANDS


SPLIT = DEPLOY / "k8s-split-roles"
ROLE = "leap-stream/role"


def _without_role(doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` with what makes it the completions role taken out again."""
    d = json.loads(json.dumps(doc))
    d["metadata"]["name"] = "leap-stream-worker"
    d["metadata"].get("labels", {}).pop(ROLE, None)
    spec = d["spec"]
    if d["kind"] == "ScaledObject":
        spec["scaleTargetRef"]["name"] = "leap-stream-worker"
        return d
    spec["selector"]["matchLabels"].pop(ROLE)
    if d["kind"] == "Deployment":
        pod = spec["template"]
        pod["metadata"]["labels"].pop(ROLE)
        assert pod["spec"]["containers"][0].pop("env") == [
            {"name": "LEAP_WORKER_ROLES", "value": "completions"}
        ]
        for t in pod["spec"]["topologySpreadConstraints"]:
            t["labelSelector"]["matchLabels"].pop(ROLE)
    return d


def test_split_roles_completions_worker_is_the_base_worker_in_its_role(
    k8s: list[dict[str, Any]],
) -> None:
    """deploy/k8s-split-roles/completions-worker.yaml is a copy of the base worker: it may
    differ only by its role (name, role label in every selector, LEAP_WORKER_ROLES, the
    completions trigger alone, one replica at least)."""
    cm = one(k8s, "ConfigMap")["data"]
    docs = {d["kind"]: d for d in load_all(SPLIT / "completions-worker.yaml")}
    assert set(docs) == {"Deployment", "PodDisruptionBudget", "ScaledObject"}
    assert _without_role(docs["Deployment"]) == one(k8s, "Deployment")
    assert _without_role(docs["PodDisruptionBudget"]) == one(k8s, "PodDisruptionBudget")
    so, base_so = _without_role(docs["ScaledObject"]), one(k8s, "ScaledObject")
    (trigger,) = so["spec"].pop("triggers")
    assert trigger["metadata"]["topic"] == cm["LEAP_TOPIC_COMPLETIONS"]
    assert trigger in base_so["spec"]["triggers"]
    assert so["spec"].pop("minReplicaCount") == 1
    rest = {k: v for k, v in base_so["spec"].items() if k not in ("triggers", "minReplicaCount")}
    assert so["spec"] == rest


def test_split_roles_patches_fit_the_base(k8s: list[dict[str, Any]]) -> None:
    """The overlay's JSON patches assume a container without env (``add`` would replace
    one), the completions trigger second, one topology constraint; kustomize would refuse a
    failed ``test``, this says why before anyone applies it."""
    cm = one(k8s, "ConfigMap")["data"]
    kustomization = yaml.safe_load((SPLIT / "kustomization.yaml").read_text())
    assert kustomization["resources"] == ["../k8s", "completions-worker.yaml"]
    pod = one(k8s, "Deployment")["spec"]["template"]["spec"]
    assert "env" not in pod["containers"][0]
    assert len(pod["topologySpreadConstraints"]) == 1
    triggers = one(k8s, "ScaledObject")["spec"]["triggers"]
    assert [t["metadata"]["topic"] for t in triggers] == [
        cm["LEAP_TOPIC_SUBMISSIONS"],
        cm["LEAP_TOPIC_COMPLETIONS"],
    ]
    patched = {p["target"]["kind"]: p["patch"] for p in kustomization["patches"]}
    assert "value: submissions" in patched["Deployment"]
    assert f"value: {cm['LEAP_TOPIC_COMPLETIONS']}" in patched["ScaledObject"]


def test_the_store_scripts_are_lua_files_of_the_package() -> None:
    """The online store's Redis scripts live in leap_stream/store/lua/ (read at import, shipped
    in the wheel as package data), not in Python strings."""
    from leap_stream.store import online

    lua = ROOT / "leap_stream" / "store" / "lua"
    assert (lua / "apply.lua").read_text() == online.APPLY_LUA
    assert (lua / "read.lua").read_text() == online.READ_LUA
    assert "redis.call" in online.APPLY_LUA and "redis.call" in online.READ_LUA
    source = (ROOT / "leap_stream" / "store" / "online.py").read_text()
    assert "redis.call" not in source
