"""An engine names its GPU by the UUID nvidia-smi shows, whatever index CUDA_VISIBLE_DEVICES gave it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from engine.gpu_identity import format_uuid, gpu_uuid


def test_an_engine_on_cpu_reports_no_gpu() -> None:
    assert gpu_uuid(torch.device("cpu")) == ""


def test_a_cuda_device_reports_its_uuid_with_the_nvidia_smi_prefix(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[torch.device] = []

    def properties(device: torch.device) -> SimpleNamespace:
        asked.append(device)
        return SimpleNamespace(uuid="ffc79498-8ff3-c2dc-3b0d-fafd804516ae")

    monkeypatch.setattr(torch.cuda, "get_device_properties", properties)
    assert gpu_uuid(torch.device("cuda", 1)) == "GPU-ffc79498-8ff3-c2dc-3b0d-fafd804516ae"
    assert asked == [torch.device("cuda", 1)]


def test_a_torch_without_device_uuids_reports_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: SimpleNamespace(name="H200"))
    assert gpu_uuid(torch.device("cuda", 0)) == ""


def test_uuids_already_prefixed_are_kept_as_they_are() -> None:
    assert format_uuid("GPU-1234") == "GPU-1234"
    assert format_uuid("MIG-abcd") == "MIG-abcd"
    assert format_uuid(" 1234 ") == "GPU-1234"
    assert format_uuid(None) == format_uuid("") == ""
