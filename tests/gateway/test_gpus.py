"""Engines index into the GPUs the server was given: engine i takes the i-th entry of the server's
CUDA_VISIBLE_DEVICES (or GPU i of the host), and too few GPUs stop the server before any engine starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.engines import EnginePool
from gateway.gpus import NotEnoughGpus, engine_gpus, host_gpu_count, visible_gpus
from gateway.metrics import GatewayMetrics
from gateway.settings import Settings, parse_settings
from tests.gateway.helpers import start_gateway


def gpu_settings(engines: int, visible: str | None, *flags: str) -> Settings:
    environ = {} if visible is None else {"CUDA_VISIBLE_DEVICES": visible}
    return parse_settings(["--engines", str(engines), "--device", "cuda", *flags], environ)


def test_a_users_cuda_visible_devices_gives_engine_i_its_ith_gpu() -> None:
    assert engine_gpus(gpu_settings(2, "2,3")) == ("2", "3")
    assert engine_gpus(gpu_settings(2, " 3 , 1 ")) == ("3", "1")  # their order, not sorted
    uuids = "GPU-8a5c7e11-0000-0000-0000-000000000001,GPU-8a5c7e11-0000-0000-0000-000000000002"
    assert engine_gpus(gpu_settings(2, uuids)) == tuple(uuids.split(","))


def test_more_gpus_than_engines_uses_the_first_ones() -> None:
    assert engine_gpus(gpu_settings(2, "4,5,6,7")) == ("4", "5")


def test_without_cuda_visible_devices_engine_i_gets_host_gpu_i() -> None:
    assert engine_gpus(gpu_settings(3, None), host_gpus=8) == ("0", "1", "2")


def test_fewer_gpus_than_engines_is_a_clear_error() -> None:
    with pytest.raises(NotEnoughGpus, match=r"--engines 3 needs 3 GPUs .* CUDA_VISIBLE_DEVICES gives 2: 2,3"):
        engine_gpus(gpu_settings(3, "2,3"))
    with pytest.raises(NotEnoughGpus, match=r"--engines 2 needs 2 GPUs .* the host shows 1"):
        engine_gpus(gpu_settings(2, None), host_gpus=1)
    with pytest.raises(NotEnoughGpus, match="gives 0: none"):
        engine_gpus(gpu_settings(2, "-1"))  # CUDA's "no GPU at all"


def test_cuda_visible_devices_ends_at_its_first_invalid_entry_as_cuda_reads_it() -> None:
    assert visible_gpus("0,1,-1,2") == ("0", "1")
    assert visible_gpus("") == ()
    assert visible_gpus(None) is None


def test_one_gpu_named_twice_is_refused() -> None:
    with pytest.raises(NotEnoughGpus, match="GPU 2 more than once"):
        engine_gpus(gpu_settings(2, "2,2"))


@pytest.mark.parametrize(
    "flags",
    [
        ["--engines", "1", "--device", "cuda"],
        ["--engines", "2", "--device", "cpu"],
        ["--engines", "2", "--fake-engine"],
    ],
    ids=["one-engine", "cpu", "fake-engine"],
)
def test_one_engine_cpu_engines_and_fake_engines_inherit_the_servers_environment(flags: list[str]) -> None:
    settings = parse_settings(flags, {"CUDA_VISIBLE_DEVICES": "7"})
    assert engine_gpus(settings, host_gpus=0) == (None,) * settings.engines


def test_an_unknown_host_gpu_count_does_not_block_start(tmp_path: Path) -> None:
    assert host_gpu_count(tmp_path / "absent") is None
    (tmp_path / "gpus" / "0000:18:00.0").mkdir(parents=True)
    (tmp_path / "gpus" / "0000:2a:00.0").mkdir()
    assert host_gpu_count(tmp_path / "gpus") == 2


def test_the_pool_starts_each_engine_on_its_gpu() -> None:
    pool = EnginePool(gpu_settings(2, "2,3"), GatewayMetrics())
    assert [slot.gpu for slot in pool.slots] == ["2", "3"]


def test_the_server_refuses_to_start_with_too_few_gpus_and_says_why() -> None:
    server = start_gateway("--engines=3", "--device=cuda", engine="real", wait=False,
                           env_extra={"CUDA_VISIBLE_DEVICES": "2,3"})  # fmt: skip
    try:
        assert server.proc.wait(60) == 2
        assert (
            "error: --engines 3 needs 3 GPUs (one per engine), but CUDA_VISIBLE_DEVICES gives 2: 2,3"
            in server.log()
        )
        assert "--socket" not in server.log()  # no engine was started
    finally:
        server.stop()


def test_ready_and_the_startup_log_name_each_engines_gpu() -> None:
    server = start_gateway("--engines=2", "--engine-arg=--gpu-uuid=GPU-5f1c0de0-0000-4000-8000-00000000beef")
    try:
        engines = server.get("/ready").json()["engines"]
        assert [e["gpu_uuid"] for e in engines] == ["GPU-5f1c0de0-0000-4000-8000-00000000beef"] * 2
        assert [e["gpu"] for e in engines] == [None, None]  # fake engines keep the server's environment
        log = server.log()
        for index in (0, 1):
            assert f"engine {index} ready on cuda (GPU-5f1c0de0-0000-4000-8000-00000000beef)" in log
    finally:
        server.stop()


def test_ready_shows_no_gpu_for_an_engine_on_cpu() -> None:
    server = start_gateway()
    try:
        [engine] = server.get("/ready").json()["engines"]
        assert engine["gpu_uuid"] is None and engine["gpu"] is None
    finally:
        server.stop()
