"""compose.yaml: valid against the Compose Specification schema (offline), and what issue 8 asks of
it: GPU reserved, port published, first-run download, /ready health check, VIVACE_* settings, a
`cpu` profile, and shared memory sized for the rings of every gateway worker and engine."""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest
import yaml

from tests.deploy.conftest import MIB, REPO_ROOT, SCHEMAS, interpolate, load_json, size_bytes


def test_compose_file_is_valid_against_the_compose_specification_schema(compose: dict[str, Any],
                                                                        compose_interpolated: dict[str, Any]) -> None:  # fmt: skip
    schema = load_json(SCHEMAS / "compose-spec.json")
    validator = jsonschema.Draft7Validator(schema, format_checker=jsonschema.FormatChecker())
    for document in (compose, compose_interpolated):
        errors = sorted(validator.iter_errors(document), key=lambda e: list(e.path))
        assert not errors, "\n".join(f"{list(e.path)}: {e.message}" for e in errors)


def test_the_schema_check_rejects_a_broken_compose_file(compose: dict[str, Any]) -> None:
    broken = yaml.safe_load(yaml.safe_dump(compose))
    broken["services"]["vivace"]["healthcheck"]["start_periodd"] = "1m"
    broken["services"]["vivace-cpu"]["ports"] = "8000:8000"
    validator = jsonschema.Draft7Validator(load_json(SCHEMAS / "compose-spec.json"))
    assert len(list(validator.iter_errors(broken))) >= 2


def test_default_up_starts_only_the_gpu_service_and_the_cpu_profile_only_the_cpu_one(
    compose: dict[str, Any],
) -> None:
    # `docker compose up` reads COMPOSE_PROFILES from .env; `--profile cpu` replaces it.
    env_file = dict(
        line.split("=", 1)
        for line in (REPO_ROOT / ".env").read_text().splitlines()
        if line and not line.startswith("#")
    )
    default_profiles = set(env_file["COMPOSE_PROFILES"].split(","))

    def enabled(profiles: set[str]) -> set[str]:
        return {
            name
            for name, s in compose["services"].items()
            if not s.get("profiles") or profiles & set(s["profiles"])
        }

    assert enabled(default_profiles) == {"vivace"}
    assert enabled({"cpu"}) == {"vivace-cpu"}


def test_gpu_service_reserves_gpus_downloads_once_and_keeps_weights_on_a_volume(
    compose_interpolated: dict[str, Any],
) -> None:
    gpu = compose_interpolated["services"]["vivace"]
    devices = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "count": "1", "capabilities": ["gpu"]}]
    env = gpu["environment"]
    assert env["VIVACE_ENGINES"] == devices[0]["count"]  # one engine per reserved GPU
    assert env["VIVACE_DOWNLOAD"] == "1" and env["VIVACE_DEVICE"] == "cuda"
    assert "HF_TOKEN" in env and env["HF_HOME"] == "/models"
    assert "models:/models" in gpu["volumes"] and "models" in compose_interpolated["volumes"]
    assert gpu["ports"] == ["127.0.0.1:8000:8000"]
    # Overridable from the shell: VIVACE_ENGINES=8 reserves 8 GPUs and starts 8 engines.
    eight = interpolate(yaml.safe_load((REPO_ROOT / "compose.yaml").read_text()), {"VIVACE_ENGINES": "8"})
    gpu8 = eight["services"]["vivace"]
    assert gpu8["deploy"]["resources"]["reservations"]["devices"][0]["count"] == "8"
    assert gpu8["environment"]["VIVACE_ENGINES"] == "8"


@pytest.mark.parametrize("service", ["vivace", "vivace-cpu"])
def test_health_check_waits_on_ready_long_enough_to_start(
    compose_interpolated: dict[str, Any], service: str
) -> None:
    check = compose_interpolated["services"][service]["healthcheck"]
    assert check["test"][0] == "CMD" and "/ready" in check["test"][-1]
    minutes = int(check["start_period"].rstrip("m"))
    assert minutes >= (30 if service == "vivace" else 2)  # download + graph capture on a GPU host


def test_settings_are_vivace_environment_variables_known_to_the_gateway(
    compose_interpolated: dict[str, Any],
) -> None:
    gateway_settings = pytest.importorskip("gateway.settings")
    parser = gateway_settings.build_parser({})
    flags = {opt.lstrip("-").replace("-", "_").upper() for a in parser._actions for opt in a.option_strings}
    for service in compose_interpolated["services"].values():
        for name in service["environment"]:
            if name.startswith("VIVACE_"):
                assert name.removeprefix("VIVACE_") in flags, f"{name} is not a gateway flag"


def test_shm_size_holds_the_rings_of_every_gateway_worker_and_engine(compose: dict[str, Any]) -> None:
    sizing = compose["x-shm-sizing"]
    try:
        from engine.ipc.client import DEFAULT_AUDIO_RING_BYTES, DEFAULT_REQUEST_RING_BYTES
        from engine.ipc.segment import segment_bytes
    except ImportError:  # the engine's IPC package is not there yet: use the documented sizes
        DEFAULT_REQUEST_RING_BYTES, DEFAULT_AUDIO_RING_BYTES = 1 * MIB, 8 * MIB

        def segment_bytes(a: int, b: int) -> int:
            return a + b + 4096

    # The numbers written in compose.yaml are the code's defaults.
    assert sizing["request_ring_mib"] * MIB == DEFAULT_REQUEST_RING_BYTES
    assert sizing["audio_ring_mib"] * MIB == DEFAULT_AUDIO_RING_BYTES
    per_link = segment_bytes(DEFAULT_REQUEST_RING_BYTES, DEFAULT_AUDIO_RING_BYTES)
    for name, service in compose["services"].items():
        engines = sizing["max_engines"][name]
        needed = sizing["gateway_workers"] * engines * per_link + sizing["headroom_mib"] * MIB
        assert size_bytes(service["shm_size"]) >= needed, f"{name}: shm_size below {needed / MIB:.1f} MiB"
        assert size_bytes(service["shm_size"]) > 64 * MIB  # more than Docker's default
