"""deploy/k8s: every manifest validates against the Kubernetes v1.34 strict schemas (offline), and
the Deployment is what issue 8 asks: one GPU per pod, readiness on /ready, /dev/shm in memory
sized like compose.yaml's shm_size for one engine."""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest
from referencing import Registry, Resource

from tests.deploy.conftest import K8S_DIR, MIB, SCHEMAS, load_json, quantity_bytes

SCHEMA_DIR = SCHEMAS / "kubernetes-v1.34.0-strict"
SCHEMA_FILES = {
    ("apps/v1", "Deployment"): "deployment-apps-v1.json",
    ("v1", "Service"): "service-v1.json",
    ("policy/v1", "PodDisruptionBudget"): "poddisruptionbudget-policy-v1.json",
}


def validator_for(document: dict[str, Any]) -> jsonschema.protocols.Validator:
    definitions = load_json(SCHEMA_DIR / "_definitions.json")
    registry = Registry().with_resource(definitions["$id"], Resource.from_contents(definitions))
    key = (document.get("apiVersion"), document.get("kind"))
    assert key in SCHEMA_FILES, f"no vendored schema for {key}"
    return jsonschema.Draft202012Validator(load_json(SCHEMA_DIR / SCHEMA_FILES[key]), registry=registry)


def errors_of(document: dict[str, Any]) -> list[str]:
    return [f"{list(e.absolute_path)}: {e.message}" for e in validator_for(document).iter_errors(document)]


def test_manifests_are_valid_against_the_kubernetes_schemas(k8s_documents: list[dict[str, Any]]) -> None:
    kinds = sorted(d["kind"] for d in k8s_documents)
    assert kinds == ["Deployment", "PodDisruptionBudget", "Service"]
    for document in k8s_documents:
        assert errors_of(document) == [], document["kind"]


def test_the_schema_check_rejects_a_misspelt_field(k8s_documents: list[dict[str, Any]]) -> None:
    deployment = next(d for d in k8s_documents if d["kind"] == "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    container["readinessProbes"] = container.pop("readinessProbe")  # strict schemas refuse unknown fields
    try:
        assert errors_of(deployment)
    finally:
        container["readinessProbe"] = container.pop("readinessProbes")


def deployment_parts(k8s_documents: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    deployment = next(d for d in k8s_documents if d["kind"] == "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    return pod, pod["containers"][0]


def test_each_pod_gets_one_gpu_one_engine_and_a_ready_probe(k8s_documents: list[dict[str, Any]]) -> None:
    pod, container = deployment_parts(k8s_documents)
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["VIVACE_ENGINES"] == "1" and env["VIVACE_DEVICE"] == "cuda"
    assert container["readinessProbe"]["httpGet"]["path"] == "/ready"
    deployment = next(d for d in k8s_documents if d["kind"] == "Deployment")
    service = next(d for d in k8s_documents if d["kind"] == "Service")
    assert service["spec"]["selector"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()


def test_dev_shm_is_memory_backed_and_holds_one_engines_rings(k8s_documents: list[dict[str, Any]],
                                                               compose: dict[str, Any]) -> None:  # fmt: skip
    pod, container = deployment_parts(k8s_documents)
    mount = next(m for m in container["volumeMounts"] if m["mountPath"] == "/dev/shm")
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    assert volume["emptyDir"]["medium"] == "Memory"
    sizing = compose["x-shm-sizing"]
    engines = int(container["resources"]["limits"]["nvidia.com/gpu"])
    needed = (
        sizing["gateway_workers"] * engines * (sizing["request_ring_mib"] + sizing["audio_ring_mib"]) * MIB
    )
    needed += sizing["headroom_mib"] * MIB
    assert quantity_bytes(volume["emptyDir"]["sizeLimit"]) >= needed


def test_readme_explains_websocket_affinity_at_the_load_balancer() -> None:
    text = (K8S_DIR / "README.md").read_text().lower()
    assert "websocket" in text and "affinity" in text


@pytest.mark.parametrize("path", sorted(p.name for p in K8S_DIR.glob("*.yaml")))
def test_every_manifest_is_documented_in_the_readme(path: str) -> None:
    assert path in (K8S_DIR / "README.md").read_text()
