"""The deployment recipe in deploy/ is consistent with the code, as far as a machine without
Docker or Kubernetes can check: the YAML parses, every metric it names exists, every port agrees,
the image's command is ``runqueueworker`` with options its parser accepts, and the worker's
grace period and probes are there."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from spanner_queues.contrib.metrics import METRIC_NAMES
from spanner_queues.management.commands.runqueueworker import Command as RunQueueWorker

yaml = pytest.importorskip("yaml")

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
pytestmark = pytest.mark.engine_independent  # files and argument parsing, no database
#: series a histogram family exposes besides its name
HISTOGRAM_SERIES = ("_bucket", "_count", "_sum")


def _documents() -> dict[str, list[dict[str, Any]]]:
    found = {}
    for path in sorted((DEPLOY / "kubernetes").glob("*.yaml")):
        found[path.name] = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    return found


def _kind(kind: str, name: str) -> dict[str, Any]:
    for docs in _documents().values():
        for doc in docs:
            if doc["kind"] == kind and doc["metadata"]["name"] == name:
                return doc
    raise AssertionError(f"no {kind} {name} in deploy/kubernetes")


def _stage(stage: str) -> str:
    """The text of one ``FROM ... AS stage`` block of the Dockerfile."""
    text = (DEPLOY / "Dockerfile").read_text()
    blocks = re.split(r"^FROM ", text, flags=re.M)
    [block] = [b for b in blocks if re.match(rf"\S+ AS {stage}\b", b)]
    return block


def _cmd(stage: str) -> list[str]:
    [line] = re.findall(r"^CMD (\[.*\])$", _stage(stage), re.M)
    return json.loads(line)


def _worker_options() -> Any:
    cmd = _cmd("worker")
    assert cmd[:3] == ["python", "manage.py", "runqueueworker"]
    parser = RunQueueWorker().create_parser("manage.py", "runqueueworker")
    return parser.parse_args(cmd[3:])  # a refused option raises CommandError


def _worker_container() -> dict[str, Any]:
    deployment = _kind("Deployment", "shop-worker")
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    return container


def test_every_yaml_file_parses_and_names_its_kind() -> None:
    documents = _documents()
    assert set(documents) >= {"worker.yaml", "web.yaml", "keda-scaledobject.yaml"}
    for name, docs in documents.items():
        assert docs, name
        for doc in docs:
            assert doc.get("apiVersion") and doc.get("kind") and doc["metadata"]["name"], name


def test_every_metric_the_files_name_is_exported() -> None:
    texts = [p.read_text() for p in DEPLOY.rglob("*") if p.is_file()]
    named = set()
    for text in texts:
        named |= set(re.findall(r"\bspanner_queues_[a-z_]+", text))
    assert named, "the recipe names no metric"
    exported = set(METRIC_NAMES) | {m + s for m in METRIC_NAMES for s in HISTOGRAM_SERIES}
    assert named - exported == set()
    keda = _kind("ScaledObject", "shop-worker")
    queries = [t["metadata"]["query"] for t in keda["spec"]["triggers"]]
    assert any("spanner_queues_buffered_ready_messages" in q for q in queries)
    assert {t["type"] for t in keda["spec"]["triggers"]} == {"prometheus"}


def test_the_image_command_is_the_documented_runqueueworker_command() -> None:
    options = _worker_options()
    assert options.metrics_addr == "0.0.0.0"  # reachable by the kubelet and Prometheus
    assert options.concurrency >= 1
    commands = (ROOT / "docs" / "reference" / "commands.md").read_text()
    for flag in re.findall(r"--[a-z-]+", " ".join(_cmd("worker")[3:])):
        assert f"`{flag} " in commands or f"`{flag}`" in commands, flag
    assert "STOPSIGNAL SIGTERM" in _stage("worker")


def test_every_port_agrees() -> None:
    options = _worker_options()
    port = options.metrics_port if options.metrics_port is not None else options.health_port
    assert re.findall(r"^EXPOSE (\d+)$", _stage("worker"), re.M) == [str(port)]
    container = _worker_container()
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"metrics": port}
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        get = container[probe]["httpGet"]
        assert get["port"] in ports or get["port"] == port, probe
        assert get["path"] in ("/livez", "/readyz"), probe
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/livez"
    monitor = _kind("PodMonitor", "shop-worker")
    assert [e["port"] for e in monitor["spec"]["podMetricsEndpoints"]] == ["metrics"]
    web = _kind("Deployment", "shop-web")["spec"]["template"]["spec"]["containers"][0]
    web_cmd = _cmd("web")
    bind = web_cmd[web_cmd.index("--bind") + 1]
    assert re.findall(r"^EXPOSE (\d+)$", _stage("web"), re.M) == [bind.rsplit(":", 1)[1]]
    assert [p["containerPort"] for p in web["ports"]] == [int(bind.rsplit(":", 1)[1])]


def test_the_worker_deployment_drains_gracefully_with_probes_and_resources() -> None:
    options = _worker_options()
    deployment = _kind("Deployment", "shop-worker")
    grace = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert options.health_max_run is not None and grace > options.health_max_run
    container = _worker_container()
    assert "command" not in container and "args" not in container  # the image's command
    assert container["resources"]["requests"] and container["resources"]["limits"]
    keda = _kind("ScaledObject", "shop-worker")
    assert keda["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
    images = {
        c["image"].split(":")[0]
        for docs in _documents().values()
        for doc in docs
        if doc["kind"] in ("Deployment", "Job")
        for c in doc["spec"]["template"]["spec"]["containers"]
    }
    assert images == {"shop-web", "shop-worker"}
    job = _kind("Job", "shop-migrate")["spec"]["template"]["spec"]["containers"][0]
    assert job["command"] == ["python", "manage.py", "migrate", "--noinput"]


def test_the_image_installs_the_readme_install_line() -> None:
    readme = (ROOT / "README.md").read_text()
    assert 'python -m pip install --find-links ~/wheels "spanner-queues[spanner,metrics]"' in readme
    base = _stage("base")
    # the wheelhouse is a build context of its own (--build-context wheels=...), not the
    # project's directory: the image builds from wherever the wheels were built
    assert "RUN --mount=type=bind,from=wheels,target=/tmp/wheels" in base
    assert '--find-links /tmp/wheels \\\n        "spanner-queues[spanner,metrics]"' in base
    assert "COPY dist" not in base
    deploy_readme = (DEPLOY / "README.md").read_text()
    assert deploy_readme.count("--build-context wheels=$HOME/wheels") == 2
