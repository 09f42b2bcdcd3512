"""Model loading under a hostile user (issue 36): a hub that never answers, pickles behind an index or a config,
names the OS cannot look up, configs that do not fit their weights. Every load goes through the real ``load()``;
the hubs are loopback servers, and every wait on them is bounded here too.
"""

from __future__ import annotations

import hashlib
import json
import pickle
import shutil
import threading
import time
from collections import OrderedDict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import HANG_S, build_tiny_t5
from core import models
from core.cli import main
from core.errors import ModelLoadError


def _one_line(err: BaseException) -> str:
    msg = str(err)
    assert "\n" not in msg and "Traceback" not in msg and "\n" not in err.app_text, msg
    return msg


def _in_thread(fn, *args, **kwargs):
    """Run ``fn`` in a daemon thread; the box gets ("ok", value) or ("err", exception), and "time" when it ended."""
    box: dict = {}

    def work():
        try:
            box["ok"] = fn(*args, **kwargs)
        except BaseException as err:  # noqa: BLE001 - handed to the test
            box["err"] = err
        box["time"] = time.monotonic()

    t = threading.Thread(target=work, daemon=True)
    t.start()
    return t, box


# --- 1. a hub that accepts and never answers ---------------------------------------------------------------


def test_the_stated_bound():
    assert models.hub.HUB_WAIT_S == 20.0 and "HUB_WAIT_S" in models.hub.__doc__ and "20 s" in models.hub.__doc__


def test_a_silent_hub_fails_within_the_bound_in_one_line(silent_hub, monkeypatch):
    monkeypatch.setattr(models.hub, "HUB_WAIT_S", 2.0)
    t0 = time.monotonic()
    with pytest.raises(ModelLoadError) as err:
        models.load("someorg/some-t5", device="cpu")
    took = time.monotonic() - t0
    assert 1.8 < took < 2.0 + HANG_S, took  # it waited for the bound, and gave up (how long past it: bench/bounds.py)
    msg = _one_line(err.value)
    assert f"127.0.0.1:{silent_hub.port}" in msg and "sent nothing for 2 s" in msg and "someorg/some-t5" in msg
    assert "sent nothing for 2 s" in err.value.app_text and str(silent_hub.port) not in err.value.app_text
    assert silent_hub.requests >= 1  # the hub was really asked (past the connect probe)


def test_loads_of_one_silent_repo_share_one_download(silent_hub, monkeypatch):
    monkeypatch.setattr(models.hub, "HUB_WAIT_S", 2.0)
    runs = [
        _in_thread(models.load, "someorg/shared-t5", device="cpu"),
        _in_thread(models.load, "someorg/shared-t5", device="cpu", dtype="bfloat16"),
    ]  # two cache keys, one repo
    t0 = time.monotonic()
    for t, _ in runs:
        t.join(2.0 + 5.0)
        assert not t.is_alive(), "a load of a silent hub outlived its bound"
    for _, box in runs:
        assert isinstance(box.get("err"), ModelLoadError) and box["time"] - t0 < 2.0 + 3.0
        _one_line(box["err"])
    assert silent_hub.requests == 1  # one request: the second load joined the first one's download


@pytest.mark.slow
def test_a_silent_hub_does_not_hold_up_a_local_folder(silent_hub, monkeypatch, tiny_dir):
    """The issue's two sessions: one loads from a hub that never answers, the other opens a folder meanwhile."""
    monkeypatch.setattr(models.hub, "HUB_WAIT_S", 6.0)
    hub_load, hub_box = _in_thread(models.load, "someorg/stalled-t5", device="cpu")
    end = time.monotonic() + 5.0
    while silent_hub.requests < 1 and time.monotonic() < end:  # until the hub load is inside its wait
        time.sleep(0.02)
    assert silent_hub.requests >= 1 and hub_load.is_alive()
    t0 = time.monotonic()
    local, local_box = _in_thread(models.load, str(tiny_dir), device="cpu", train_length=301)  # not cached yet
    local.join(6.0)
    assert "ok" in local_box, local_box.get("err", "the local load waited on the hub's download")
    assert local_box["time"] - t0 < 4.0 and hub_load.is_alive()  # done while the hub load still waits
    assert local_box["ok"].train_length == 301 and local_box["ok"].n_layers == 2
    hub_load.join(6.0 + 5.0)
    assert isinstance(hub_box.get("err"), ModelLoadError)


class FakeHub(ThreadingHTTPServer):
    """A loopback hub that answers like huggingface.co for one repo (model info, HEAD and GET of its files),
    and records every path asked for."""

    daemon_threads = True

    def __init__(self, repo_id: str, folder: Path) -> None:
        self.repo_id, self.folder, self.asked = repo_id, folder, []
        self.sha = hashlib.sha1(repo_id.encode()).hexdigest()
        super().__init__(("127.0.0.1", 0), _FakeHubHandler)
        threading.Thread(target=self.serve_forever, daemon=True).start()


class _FakeHubHandler(BaseHTTPRequestHandler):
    def log_message(self, *args):  # quiet
        pass

    def _send(self, body: bytes, headers: dict, head: bool) -> None:
        self.send_response(200)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def _answer(self, head: bool) -> None:
        hub: FakeHub = self.server
        path = self.path.split("?")[0]
        hub.asked.append(path)
        if path.startswith(f"/api/models/{hub.repo_id}"):
            info = {
                "id": hub.repo_id,
                "modelId": hub.repo_id,
                "sha": hub.sha,
                "private": False,
                "siblings": [{"rfilename": p.name} for p in sorted(hub.folder.iterdir())],
            }
            return self._send(json.dumps(info).encode(), {"Content-Type": "application/json"}, head)
        prefix = f"/{hub.repo_id}/resolve/"
        if path.startswith(prefix):
            name = path[len(prefix) :].split("/", 1)[1]
            file = hub.folder / name
            if file.is_file():
                body = file.read_bytes()
                return self._send(
                    body, {"X-Repo-Commit": hub.sha, "ETag": f'"{hashlib.sha256(body).hexdigest()}"'}, head
                )
        self.send_response(404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_GET(self):
        self._answer(head=False)

    def do_HEAD(self):
        self._answer(head=True)


class Boom:
    """Unpickling this creates ``marker``: proof that a pickle was loaded."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _malicious_pickle(path: Path, marker: Path) -> Path:
    with open(path, "wb") as f:
        pickle.dump({"shared.weight": Boom(marker)}, f)
    return path


def test_a_hub_download_fetches_only_what_a_load_reads(hub_env, monkeypatch, tmp_path, tiny_dir):
    repo = tmp_path / "repo"
    shutil.copytree(tiny_dir, repo)
    marker = tmp_path / "pwned"
    _malicious_pickle(repo / "pytorch_model.bin", marker)
    (repo / "README.md").write_text("a model card")
    hub = FakeHub("someorg/good-t5", repo)
    try:
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{hub.server_address[1]}")
        t, box = _in_thread(models.load, "someorg/good-t5", device="cpu")
        t.join(60)
        assert "ok" in box, box.get("err", "the download did not end")
        assert box["ok"].n_layers == 2
    finally:
        hub.shutdown()
        hub.server_close()
    assert not marker.exists()
    fetched = {p.rsplit("/", 1)[-1] for p in hub.asked if "/resolve/" in p}
    assert "model.safetensors" in fetched and "config.json" in fetched
    assert "pytorch_model.bin" not in fetched and "README.md" not in fetched
    snap = models.cached_snapshot("someorg/good-t5")
    assert snap is not None and not (snap / "pytorch_model.bin").exists()
    models.loading._CACHE.clear()
    monkeypatch.setattr(models.hub, "hub_reachable", lambda *a, **k: pytest.fail("a complete cached copy needs no hub"))
    again = models.load("someorg/good-t5", device="cpu")  # the download is now a cached snapshot
    assert again.n_layers == 2 and again.train_length == 256  # with its card.json (before it, L_tr is assumed 512)


# --- 2. no pickle is ever unpickled --------------------------------------------------------------------------


def _folder_without_weights(tmp_path: Path, tiny_dir: Path) -> Path:
    d = tmp_path / "model"
    d.mkdir()
    for f in tiny_dir.iterdir():
        if f.name != "model.safetensors":
            shutil.copy(f, d / f.name)
    return d


def _index(d: Path, name: str, shard: str) -> None:
    (d / name).write_text(json.dumps({"metadata": {}, "weight_map": {"shared.weight": shard, "lm_head.weight": shard}}))


LAYOUTS = {
    "safetensors index -> .bin": lambda d, m: (
        _malicious_pickle(d / "pytorch_model.bin", m),
        _index(d, "model.safetensors.index.json", "pytorch_model.bin"),
    ),
    "safetensors index -> ../x.safetensors": lambda d, m: _index(d, "model.safetensors.index.json", "../x.safetensors"),
    "pytorch_model.bin alone": lambda d, m: _malicious_pickle(d / "pytorch_model.bin", m),
    "bin index and shards": lambda d, m: (
        _malicious_pickle(d / "pytorch_model-00001-of-00001.bin", m),
        _index(d, "pytorch_model.bin.index.json", "pytorch_model-00001-of-00001.bin"),
    ),
    "config transformers_weights -> adapter_model.bin": lambda d, m: (
        _malicious_pickle(d / "adapter_model.bin", m),
        (d / "config.json").write_text(
            json.dumps({**json.loads((d / "config.json").read_text()), "transformers_weights": "adapter_model.bin"})
        ),
    ),
    "a pickle named model.safetensors": lambda d, m: _malicious_pickle(d / "model.safetensors", m),
    "a pickle named as a shard": lambda d, m: (
        _malicious_pickle(d / "model-00001-of-00001.safetensors", m),
        _index(d, "model.safetensors.index.json", "model-00001-of-00001.safetensors"),
    ),
    ".pt .ckpt .pth .msgpack .h5": lambda d, m: [
        _malicious_pickle(d / f"weights{ext}", m) for ext in (".pt", ".ckpt", ".pth", ".msgpack", ".h5")
    ],
}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_weights_that_are_not_safetensors_are_never_opened(tmp_path, tiny_dir, capfd, layout):
    d = _folder_without_weights(tmp_path, tiny_dir)
    marker = tmp_path / "pwned"
    LAYOUTS[layout](d, marker)
    with pytest.raises(ModelLoadError) as err:
        models.load(str(d), device="cpu")
    msg = _one_line(err.value)
    assert "safetensors" in msg and "no pickle is ever read" in msg
    assert str(tmp_path) not in err.value.app_text  # the app names the folder, not the server's path
    assert not marker.exists()
    assert capfd.readouterr().err == ""


def test_a_malicious_bin_beside_safetensors_weights_is_left_alone(tmp_path, tiny_dir, monkeypatch):
    """A full ``hf download`` holds pickles beside model.safetensors: the folder loads, and the pickle stays unread."""
    monkeypatch.setattr(models.loading, "_CACHE", OrderedDict())
    d = tmp_path / "model"
    shutil.copytree(tiny_dir, d)
    marker = tmp_path / "pwned"
    _malicious_pickle(d / "pytorch_model.bin", marker)
    _index(d, "pytorch_model.bin.index.json", "pytorch_model.bin")
    assert models.load(str(d), device="cpu").n_layers == 2
    assert not marker.exists()


def test_sharded_safetensors_load(tmp_path, monkeypatch):
    monkeypatch.setattr(models.loading, "_CACHE", OrderedDict())
    d = build_tiny_t5(tmp_path / "sharded", seed=4)
    from transformers import T5ForConditionalGeneration

    T5ForConditionalGeneration.from_pretrained(d).save_pretrained(d, max_shard_size="40KB")
    (d / "model.safetensors").unlink(missing_ok=True)
    assert (d / "model.safetensors.index.json").is_file()
    assert models.load(str(d), device="cpu").n_layers == 2


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    shard=st.one_of(
        st.text(max_size=40),
        st.integers(),
        st.none(),
        st.lists(st.text(max_size=5), max_size=2),
        st.sampled_from(
            [
                "x.bin",
                "../model.safetensors",
                "/etc/model.safetensors",
                "a/b.safetensors",
                "model.safetensors\x00.bin",
                ".safetensors",
                "ok.safetensors",
            ]
        ),
    )
)
def test_any_index_is_refused_in_one_line_or_names_a_real_safetensors_file(tmp_path, tiny_dir, shard):
    d = tmp_path / "prop"
    if d.exists():
        shutil.rmtree(d)
    d.mkdir()
    shutil.copy(tiny_dir / "config.json", d / "config.json")
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"shared.weight": shard}}))
    try:
        shapes = models.check_weight_files(d)
    except ModelLoadError as err:
        _one_line(err)
    else:  # only a plain name of a safetensors file that is there can pass
        assert isinstance(shard, str) and shard.endswith(".safetensors") and (d / shard).is_file() and shapes


# --- 6. names the OS cannot look up ------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["a" * 260, "org/" + "a" * 260, "./" + "a" * 260, "x/" + "b" * 300 + "/c", "a\x00b"])
def test_a_name_the_os_cannot_look_up_is_one_line(name, capfd):
    for call in (
        lambda: models.resolve(name),
        lambda: models.load(name, device="cpu"),
        lambda: models.load(str(Path(__file__).parent), device="cpu", tokenizer=name),
    ):
        with pytest.raises(ModelLoadError) as err:
            call()
        assert len(_one_line(err.value)) < 400  # the name is shortened, not repeated in full
    assert main(["run", "--model", name]) == 2
    err_lines = capfd.readouterr().err.strip().splitlines()
    assert len(err_lines) == 1 and err_lines[0].startswith("error:")


# --- 8. a config that does not fit its weights ---------------------------------------------------------------


def _with_config(tmp_path: Path, tiny_dir: Path, **changes) -> Path:
    d = tmp_path / "model"
    shutil.copytree(tiny_dir, d)
    cfg = json.loads((d / "config.json").read_text())
    cfg.update(changes)
    (d / "config.json").write_text(json.dumps(cfg))
    return d


@pytest.mark.parametrize(
    "changes,needle",
    [
        ({"num_layers": 3}, "declares 3 encoder layers (num_layers) and the weights hold 2"),
        ({"num_layers": 1}, "declares 1 encoder layers (num_layers) and the weights hold 2"),
        ({"num_decoder_layers": 2}, "declares 2 decoder layers"),
        ({"num_layers": 0}, "num_layers is 0"),
        ({"num_layers": -1}, "num_layers is -1"),
        ({"num_heads": 0}, "num_heads is 0"),
        ({"num_decoder_layers": 0}, "num_decoder_layers is 0"),
        ({"d_ff": 256}, "DenseReluDense"),
        ({"d_ff": 10**9}, "DenseReluDense"),  # refused on the headers: nothing of that size is ever allocated
        ({"d_kv": 8}, "SelfAttention"),
    ],
)
def test_a_config_that_does_not_fit_the_weights_is_one_line(tmp_path, tiny_dir, capfd, monkeypatch, changes, needle):
    monkeypatch.setattr(models.loading, "_CACHE", OrderedDict())
    d = _with_config(tmp_path, tiny_dir, **changes)
    with pytest.raises(ModelLoadError) as err:
        models.load(str(d), device="cpu")
    msg = _one_line(err.value)
    assert needle in msg and "does not match" in msg, msg
    assert capfd.readouterr().err == ""  # no load report, no warning


def _rewrite_weights(d: Path, drop: str | None = None, add: str | None = None) -> None:
    import torch
    from safetensors.torch import load_file, save_file

    tensors = load_file(d / "model.safetensors")
    if drop:
        del tensors[drop]
    if add:
        tensors[add] = torch.zeros(3)
    save_file(tensors, d / "model.safetensors", metadata={"format": "pt"})


@pytest.mark.parametrize(
    "drop,add,needle",
    [
        ("encoder.final_layer_norm.weight", None, "1 missing (encoder.final_layer_norm.weight)"),
        (None, "encoder.extra.weight", "1 unexpected (encoder.extra.weight)"),
    ],
)
def test_missing_or_unexpected_weights_are_one_line_and_no_report(
    tmp_path, tiny_dir, capfd, monkeypatch, drop, add, needle
):
    monkeypatch.setattr(models.loading, "_CACHE", OrderedDict())
    d = _with_config(tmp_path, tiny_dir)
    _rewrite_weights(d, drop, add)
    with pytest.raises(ModelLoadError) as err:
        models.load(str(d), device="cpu")
    msg = _one_line(err.value)
    assert needle in msg, msg
    assert "LOAD REPORT" not in capfd.readouterr().err


def test_cli_exits_2_with_one_line_for_an_extra_declared_layer(tmp_path, capfd):
    """The issue's probe: 4 layers declared over weights for 3 ran with exit 0 and a 12-line report on stderr."""
    d = build_tiny_t5(tmp_path / "three", layers=3, seed=2)
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "num_layers": 4}))
    assert main(["run", "--json", "--model", str(d), "--tokens", "300"]) == 2
    out = capfd.readouterr()
    lines = out.err.strip().splitlines()
    assert out.out == "" and len(lines) == 1 and "declares 4 encoder layers" in lines[0], out.err


def test_the_report_filter_spares_other_loads(tmp_path, tiny_dir):
    """A load outside this module (a user's own from_pretrained) keeps transformers' report."""
    import logging

    from transformers import T5ForConditionalGeneration

    seen: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())
    log = logging.getLogger("transformers.modeling_utils")
    log.addHandler(handler)
    try:
        T5ForConditionalGeneration.from_pretrained(_with_config(tmp_path, tiny_dir, num_layers=3))
    finally:
        log.removeHandler(handler)
    assert any("LOAD REPORT" in m for m in seen)
