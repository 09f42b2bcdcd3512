"""Loading through the real load() path: folders, registry names, and clear refusals."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket

import pytest
import torch

from core import models
from core.errors import ModelLoadError, UserError
from core.models import load, pick_device, registry, resolve


def test_load_local_folder(tiny, tiny_dir):
    assert tiny.model.config._attn_implementation == "aligned"
    assert tiny.train_length == 256 and tiny.n_heads == 4 and tiny.n_layers == 2 and tiny.d_kv == 16
    assert tiny.device.type in ("cpu", "cuda")
    assert tiny.dtype == (torch.bfloat16 if tiny.device.type == "cuda" else torch.float32)
    again = load(str(tiny_dir), device="cpu")
    assert load(str(tiny_dir), device="cpu") is again  # cached (``tiny`` itself may have been dropped: MAX_MODELS)
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


def test_unreachable_hub_model_says_how_to_use_a_folder(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelLoadError) as err:
        load("google/flan-t5-small", device="cpu")
    msg = str(err.value)
    assert "google/flan-t5-small" in msg and "folder" in msg


# --- hub ids: the local cache first, and a fast, clear refusal without one -----


def _fake_hub_cache(
    cache: "os.PathLike", repo_id: str, model_dir, revision_hash: str = "0123456789abcdef" * 2 + "01234567"
) -> "os.PathLike":
    """Lay ``model_dir`` out like huggingface_hub's cache: ``models--org--name/{blobs,snapshots/<hash>,refs/main}``,
    snapshot files as relative symlinks to content-addressed blobs (as ``hf download`` writes them)."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    snap = repo / "snapshots" / revision_hash
    (repo / "blobs").mkdir(parents=True)
    snap.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision_hash)
    for f in sorted(model_dir.iterdir()):
        data = f.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snap / f.name).symlink_to(os.path.relpath(blob, snap))
    return snap


@pytest.fixture
def no_network(monkeypatch):
    """Any reachability probe fails the test: a cached model must load without one."""

    def probe(*a, **k):
        raise AssertionError("the hub was probed although the model is cached")

    monkeypatch.setattr(models.hub, "hub_reachable", probe)
    monkeypatch.setattr(
        models.loading, "_CACHE", __import__("collections").OrderedDict()
    )  # loads here must not leak a fake model into other tests


@pytest.mark.parametrize("flag", ["HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"])
def test_uncached_hub_id_offline_fails_at_once(monkeypatch, tmp_path, flag):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv(flag, "1")
    monkeypatch.setattr(models.hub, "hub_reachable", lambda *a, **k: pytest.fail("offline mode must not probe the hub"))
    with pytest.raises(ModelLoadError) as err:  # at once: the hub is never probed (the stub above fails if it is)
        load("google/flan-t5-base", device="cpu")
    msg = str(err.value)
    assert "google/flan-t5-base" in msg and "not on this machine" in msg and flag in msg
    assert "hf download google/flan-t5-base" in msg and "folder" in msg and "HF_HOME" in msg
    assert "\n" not in msg and "Traceback" not in msg and "Retry" not in msg


def test_uncached_hub_id_unreachable_hub_fails_at_once(monkeypatch, tmp_path, capfd):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    calls = []
    monkeypatch.setattr(models.hub, "hub_reachable", lambda *a, **k: calls.append(1) or False)
    with pytest.raises(ModelLoadError) as err:
        load("flan-t5-base", device="cpu")  # registry name -> google/flan-t5-base
    assert calls == [1]  # one probe, which said no: nothing waited on the hub
    msg = str(err.value)
    assert "'google/flan-t5-base' is not on this machine" in msg and "cannot be reached" in msg
    assert str(tmp_path / "hf" / "hub") in msg  # says where it looked
    assert "\n" not in msg and "Traceback" not in msg
    assert "Retry" not in capfd.readouterr().err


def test_cached_hub_id_loads_offline(monkeypatch, tmp_path, tiny_dir, no_network):
    _fake_hub_cache(tmp_path / "hub", "test-org/tiny-t5", tiny_dir)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    spec = resolve("test-org/tiny-t5")
    assert spec.source == "test-org/tiny-t5" and spec.train_length == 256  # card.json of the cached copy
    m = load("test-org/tiny-t5", device="cpu")
    assert m.n_layers == 2 and m.n_heads == 4 and m.model.config._attn_implementation == "aligned"
    assert m.spec.source == "test-org/tiny-t5"


def test_cached_registry_model_loads_from_hf_home_without_offline_flag(monkeypatch, tmp_path, tiny_dir, no_network):
    _fake_hub_cache(tmp_path / "home" / "hub", "google/flan-t5-small", tiny_dir)
    for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        monkeypatch.delenv(v, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    m = load("flan-t5-small", device="cpu")  # no probe, no network: the complete cached copy is enough
    assert m.spec.name == "flan-t5-small" and m.train_length == 512 and m.n_layers == 2


def test_incomplete_cached_copy_is_named(monkeypatch, tmp_path, tiny_dir):
    partial = tmp_path / "partial"
    partial.mkdir()
    shutil.copy(tiny_dir / "config.json", partial / "config.json")
    _fake_hub_cache(tmp_path / "hub", "test-org/half", partial)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelLoadError, match="has no model.safetensors"):
        load("test-org/half", device="cpu")


def test_reachability_probe_on_loopback(monkeypatch):
    """The real probe, against loopback only: an open port answers, a closed one fails fast."""
    for v in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(v, raising=False)
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(1)
        monkeypatch.setattr(models.hub, "_REACH", {})
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{srv.getsockname()[1]}")
        assert models.hub_reachable(timeout=1.5)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{closed}")
    assert not models.hub_reachable(timeout=1.5)  # how long it took: bench/bounds.py ("hub probe, closed port")


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


# -- hardening (issue 25): cards, devices and tokenizers ----------------------------------


def _copy_model(src, dst, skip=()):
    """A copy of a model folder without the files in ``skip``."""
    dst.mkdir()
    for f in src.iterdir():
        if f.is_file() and f.name not in skip:
            shutil.copy(f, dst / f.name)
    return dst


@pytest.mark.parametrize(
    "card,needle",
    [
        ("[1, 2]", "JSON object, got list"),
        ("{oops", "not valid JSON"),
        ('{"train_length": "512"}', "train_length: Input should be a whole number"),
        ('{"train_length": -5}', "train_length: Input should be greater than or equal to 2"),
        ('{"train_length": 1000000000}', "train_length: Input should be less than or equal to 4000000"),
        ('{"train_length": 512.5}', "train_length: Input should be a whole number"),
        (None, "is a folder"),
    ],
)
def test_bad_card_is_one_line_naming_the_card(tmp_path, tiny_dir, card, needle):
    folder = _copy_model(tiny_dir, tmp_path / "m", skip=("card.json",))
    if card is None:
        (folder / "card.json").mkdir()
    else:
        (folder / "card.json").write_text(card)
    with pytest.raises(ModelLoadError) as err:
        resolve(str(folder))
    assert needle in str(err.value) and "card.json" in str(err.value) and "\n" not in str(err.value)


def test_card_train_length_is_used(tmp_path, tiny_dir):
    folder = _copy_model(tiny_dir, tmp_path / "m", skip=("card.json",))
    (folder / "card.json").write_text(json.dumps({"train_length": 300, "anything": {"else": [1]}}))
    assert resolve(str(folder)).train_length == 300


@pytest.mark.parametrize("bad", ["bogus", "cuda:x", "gpu", "cpu cpu", ""])
def test_unknown_device_is_one_line(bad):
    if bad == "":
        assert pick_device(bad)[0].type in ("cpu", "cuda")
        return
    with pytest.raises(ModelLoadError, match="Unknown device"):
        pick_device(bad)


def test_train_length_override_is_bounded(tiny_dir):
    for bad in (0, 1, -3, 10**12):
        with pytest.raises(UserError, match="train_length"):
            resolve(str(tiny_dir), bad)


def test_folder_without_tokenizer_is_refused_unless_one_is_named(tmp_path, tiny_dir, tiny):
    bare = _copy_model(
        tiny_dir, tmp_path / "bare", skip=models.TOKENIZER_FILES + ("added_tokens.json", "special_tokens_map.json")
    )
    with pytest.raises(ModelLoadError, match="has no tokenizer files"):
        load(str(bare), device="cpu")
    named = load(str(bare), device="cpu", tokenizer=str(tiny_dir))
    text = "the pass key is 12345"
    assert named.tokenizer(text).input_ids == tiny.tokenizer(text).input_ids
    with pytest.raises(ModelLoadError, match="Unknown tokenizer"):
        load(str(bare), device="cpu", tokenizer="no-such-tokenizer")
    with pytest.raises(ModelLoadError, match="no tokenizer files"):
        load(str(bare), device="cpu", tokenizer=str(bare))


def test_tokenizer_with_an_empty_vocabulary_is_refused(tmp_path, tiny_dir):
    """Only a tokenizer_config.json naming T5Tokenizer: transformers builds it with no vocabulary (every word <unk>)."""
    folder = _copy_model(
        tiny_dir, tmp_path / "cfg", skip=models.TOKENIZER_FILES + ("added_tokens.json", "special_tokens_map.json")
    )
    (folder / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "T5Tokenizer"}))
    with pytest.raises(ModelLoadError, match="does not know plain English words"):
        load(str(folder), device="cpu")


def test_tokenizer_of_a_bigger_vocabulary_is_refused(tmp_path, tiny_dir):
    bundled = models.bundled_specs()
    if not bundled:
        pytest.skip("no bundled model to borrow a tokenizer from")
    bare = _copy_model(
        tiny_dir, tmp_path / "bare", skip=models.TOKENIZER_FILES + ("added_tokens.json", "special_tokens_map.json")
    )
    with pytest.raises(ModelLoadError, match="vocabulary has only 384"):
        load(str(bare), device="cpu", tokenizer=bundled[0].name)


def test_dtype_override_and_refusals(tiny_dir):
    """float32 on a GPU reproduces CPU tables; float16 is refused (T5 overflows in it); bf16 on the CPU is allowed."""
    assert pick_device("cpu", "bfloat16") == (torch.device("cpu"), torch.bfloat16)
    assert pick_device("cpu", "auto") == (torch.device("cpu"), torch.float32)
    for bad in ("float16", "fp16", "half"):
        with pytest.raises(ModelLoadError, match="float16 is refused"):
            pick_device("cpu", bad)
    with pytest.raises(ModelLoadError, match="Unknown dtype"):
        pick_device("cpu", "int8")
    a = load(str(tiny_dir), device="cpu")
    b = load(str(tiny_dir), device="cpu", dtype="bf16")
    assert a is not b and a.dtype == torch.float32 and b.dtype == torch.bfloat16
    assert next(b.model.parameters()).dtype == torch.bfloat16
    assert load(str(tiny_dir), device="cpu", dtype="bfloat16") is b  # one cache entry per precision


def test_the_process_keeps_a_bounded_number_of_models(tiny_dir, monkeypatch):
    """Each model, device or L_tr override is a copy; the least recently used is dropped past MAX_MODELS."""
    from collections import OrderedDict

    from core import models

    monkeypatch.setattr(models.loading, "_CACHE", OrderedDict())
    monkeypatch.setattr(models.loading, "MAX_MODELS", 2)
    a = models.load(str(tiny_dir), device="cpu", train_length=256)
    b = models.load(str(tiny_dir), device="cpu", train_length=300)
    assert models.load(str(tiny_dir), device="cpu", train_length=256) is a  # a hit, and now the most recent
    models.load(str(tiny_dir), device="cpu", train_length=400)
    assert len(models.loading._CACHE) == 2
    assert models.load(str(tiny_dir), device="cpu", train_length=256) is a  # kept: used more recently than b
    assert models.load(str(tiny_dir), device="cpu", train_length=300) is not b  # b was dropped, loaded again
