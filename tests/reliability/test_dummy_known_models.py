"""`--load-format dummy` with a released checkpoint's id builds that checkpoint's shapes from nothing.

Each check runs in a fresh interpreter whose Hugging Face cache is an empty directory, offline, and whose
Hub endpoint is a closed port: any attempt to read the cache's files or download would fail the load.
The expected parameter counts are those of the released `model.safetensors` files (reference section 2).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.settings import DEFAULT_MODEL
from tests.gateway.helpers import REPO

RELEASED_PARAMETERS = {
    "Qwen/Qwen3-TTS-12Hz-1.7B-CustomVoice": 1_916_676_352,
    "Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice": 905_788_672,
}

PROBE = """
import json, math, sys
from engine.model.weights import expected_tensor_table, model_config
config, root = model_config(sys.argv[1], load_format=sys.argv[2])
table = expected_tensor_table(config)
print(json.dumps({"root": str(root) if root else None, "random": config.random_weights, "source": config.source,
                  "parameters": sum(math.prod(s) for s in table.values()), "tensors": len(table),
                  "sample_rate": config.codec.output_sample_rate}))
"""


def offline_env(tmp_path: Path) -> dict[str, str]:
    hf_home = tmp_path / "hf-home"
    hf_home.mkdir(exist_ok=True)
    return {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "VIVACE_"))} | {
        "HF_HOME": str(hf_home),
        "HF_HUB_OFFLINE": "1",
        "HF_ENDPOINT": "http://127.0.0.1:9",  # discard port: a download attempt cannot succeed
    }


def probe(model: str, load_format: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", PROBE, model, load_format],
        cwd=REPO, env=offline_env(tmp_path), capture_output=True, text=True, timeout=120,
    )  # fmt: skip


@pytest.mark.parametrize("model", sorted(RELEASED_PARAMETERS))
def test_dummy_weights_of_a_released_id_need_no_cache_and_no_download(model: str, tmp_path: Path) -> None:
    result = probe(model, "dummy", tmp_path)
    assert result.returncode == 0, result.stderr
    built = json.loads(result.stdout)
    assert built["root"] is None and built["random"] is True and built["source"] == model
    assert built["parameters"] == RELEASED_PARAMETERS[model]
    assert built["sample_rate"] == 24000
    assert not any((tmp_path / "hf-home").iterdir()), "the Hugging Face cache was written to"


def test_the_default_model_is_one_of_them() -> None:
    assert DEFAULT_MODEL in RELEASED_PARAMETERS


def test_real_weights_of_an_uncached_id_still_ask_for_a_download(tmp_path: Path) -> None:
    result = probe(DEFAULT_MODEL, "auto", tmp_path)
    assert result.returncode != 0
    assert "not in the local Hugging Face cache" in result.stderr and "--download" in result.stderr


def test_dummy_weights_of_an_unknown_uncached_id_name_the_known_models(tmp_path: Path) -> None:
    result = probe("someone/unknown-tts", "dummy", tmp_path)
    assert result.returncode != 0
    assert "someone/unknown-tts" in result.stderr and DEFAULT_MODEL in result.stderr


def test_dummy_weights_of_a_checkpoint_directory_use_its_config(tmp_path: Path) -> None:
    """A directory (or a cached snapshot) still decides the shapes; only its weights are replaced."""
    from engine.codec.config import codec_preset
    from engine.model.presets import PRESETS

    root = tmp_path / "ckpt"
    (root / "speech_tokenizer").mkdir(parents=True)
    (root / "config.json").write_text(json.dumps(PRESETS["tiny"]()[0]))
    (root / "speech_tokenizer" / "config.json").write_text(json.dumps(codec_preset("tiny").to_dict()))
    result = probe(str(root), "dummy", tmp_path)
    assert result.returncode == 0, result.stderr
    built = json.loads(result.stdout)
    assert built["root"] == str(root) and built["random"] is True
    assert built["parameters"] < 100_000_000  # the tiny shapes written there, not a full-size preset
