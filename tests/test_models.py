"""Loading through the real load() path: folders, registry names, and clear refusals."""

from __future__ import annotations

import json

import pytest
import torch

from core.errors import ModelLoadError
from core.models import load, pick_device, registry, resolve


def test_load_local_folder(tiny, tiny_dir):
    assert tiny.model.config._attn_implementation == "aligned"
    assert tiny.train_length == 256 and tiny.n_heads == 4 and tiny.n_layers == 2 and tiny.d_kv == 16
    assert tiny.device.type in ("cpu", "cuda")
    assert tiny.dtype == (torch.bfloat16 if tiny.device.type == "cuda" else torch.float32)
    assert load(str(tiny_dir), device="cpu") is tiny  # cached
    d = tiny.describe()
    assert d["attention"] == "dot product" and d["parameters"] == tiny.n_params


def test_train_length_override(tiny_dir):
    assert load(str(tiny_dir), device="cpu", train_length=512).train_length == 512


def test_registry_knows_the_paper_models():
    reg = registry()
    assert reg["flan-t5-xl"].source == "google/flan-t5-xl" and reg["flan-t5-xl"].train_length == 512
    assert reg["codet5p-220m-py"].train_length == 768
    assert reg["t5-v1_1-base-lm-adapt"].train_length == 512
    assert resolve("google/flan-t5-base").name == "flan-t5-base"


def test_unreachable_hub_model_says_how_to_use_a_folder(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelLoadError) as err:
        load("google/flan-t5-small", device="cpu")
    msg = str(err.value)
    assert "google/flan-t5-small" in msg and "folder" in msg


def test_unknown_model_name():
    with pytest.raises(ModelLoadError, match="Unknown model"):
        resolve("no-such-model")
    with pytest.raises(ModelLoadError):
        resolve("   ")


def test_not_t5_family_is_refused(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert", "hidden_size": 8}))
    with pytest.raises(ModelLoadError, match="not T5-family"):
        load(str(tmp_path), device="cpu")


def test_pickle_weights_are_refused(tmp_path, tiny):
    tiny.model.config.save_pretrained(tmp_path)
    torch.save(tiny.model.state_dict(), tmp_path / "pytorch_model.bin")
    tiny.tokenizer.save_pretrained(tmp_path)
    with pytest.raises(ModelLoadError, match="safetensors"):
        load(str(tmp_path), device="cpu")


def test_cpu_is_float32():
    assert pick_device("cpu") == (torch.device("cpu"), torch.float32)
