"""Tiny T5 models built by the tests and saved to a temp folder, loaded through the real ``load()``."""

from __future__ import annotations

import contextlib
import functools
import json
import os
from pathlib import Path

# Triton (the CUDA backend's kernel, core.mechanics.flash_attention) runs on a machine without a GPU only
# through its interpreter, which must be chosen before triton is first imported (transformers imports it).
if not Path("/proc/driver/nvidia").exists():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch
from transformers import ByT5Tokenizer, T5Config, T5ForConditionalGeneration

#: Fixtures shared by several folders of tests: the real browser's (server, page, deadline...) and a hub that is not there.
pytest_plugins = ["support.browser", "support.hub"]


def build_tiny_t5(
    folder,
    *,
    layers: int = 2,
    heads: int = 4,
    d_kv: int = 16,
    seed: int = 0,
    cosine: float | None = None,
    train_length: int = 256,
    vocab: int = 384,
    decoder_layers: int = 1,
):
    """Save a random tiny T5 (ByT5 byte tokenizer: needs no vocab file) and a card.json to ``folder``."""
    torch.manual_seed(seed)
    cfg = T5Config(
        vocab_size=vocab,
        d_model=64,
        d_kv=d_kv,
        d_ff=128,
        num_layers=layers,
        num_decoder_layers=decoder_layers,
        num_heads=heads,
        relative_attention_num_buckets=32,
        relative_attention_max_distance=128,
        dropout_rate=0.0,
        decoder_start_token_id=0,
        pad_token_id=0,
        eos_token_id=1,
    )
    if cosine is not None:
        cfg.cosine_attention = True
        cfg.cosine_scale = float(cosine)
    model = T5ForConditionalGeneration(cfg)
    # Random T5 init gives near-uniform attention; sharpen the bias and q so
    # probes see structure (and temperature effects are visible).
    with torch.no_grad():
        for blk in model.encoder.block:
            blk.layer[0].SelfAttention.q.weight.mul_(8.0)
        model.encoder.block[0].layer[0].SelfAttention.relative_attention_bias.weight.normal_(0, 2.0)
    model.save_pretrained(folder, safe_serialization=True)
    ByT5Tokenizer().save_pretrained(folder)
    (folder / "card.json").write_text(json.dumps({"train_length": train_length}))
    return folder


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    return build_tiny_t5(tmp_path_factory.mktemp("tiny-t5"))


@pytest.fixture(scope="session")
def tiny(tiny_dir):
    from core.models import load

    return load(str(tiny_dir), device="cpu")


@pytest.fixture(scope="session")
def tiny_cos_dir(tmp_path_factory):
    return build_tiny_t5(tmp_path_factory.mktemp("tiny-cos"), cosine=24.0, seed=1)


def app_model_of(name: str):
    """A module's own tiny app model (L_tr = 256, ByT5 bytes): ``app_model = app_model_of("errors-t5")`` in a test
    module. Its own folder keys its own entries in the process-wide stores of :mod:`ui.stores`, so the module's
    tests start from stores that hold nothing of its documents."""

    @pytest.fixture(scope="module")
    def app_model(tmp_path_factory):
        return build_tiny_t5(tmp_path_factory.mktemp(name), train_length=256)

    return app_model


#: The app's default model in AppTest (one per run; modules that need their own use :func:`app_model_of`).
app_model = pytest.fixture(scope="session", name="app_model")(
    lambda tmp_path_factory: build_tiny_t5(tmp_path_factory.mktemp("app-t5"), train_length=256)
)


@pytest.fixture
def env(app_model, monkeypatch):
    """The app under AppTest opens ``app_model`` by default (``AAE_MODEL``)."""
    monkeypatch.setenv("AAE_MODEL", str(app_model))
    return app_model


def concurrent_sessions(monkeypatch) -> None:
    """Let AppTest runs in several threads at once behave as sessions of one server.

    They share one ScriptCache, as in a real server (one per process, compiling
    under a lock): AppTest makes one per run, and CPython 3.11.7's compiler is
    not safe in several threads at once ("AST constructor recursion depth
    mismatch"). Likewise one Runtime: AppTest installs a mock Runtime per run
    and removes it when the run ends, so with runs in several threads one run's
    end pulls the Runtime from under another's custom component (Explore's
    scrubber looks its definition up there).
    """
    from unittest.mock import MagicMock

    from streamlit.components.v2.component_manager import BidiComponentManager
    from streamlit.runtime import Runtime
    from streamlit.runtime.scriptrunner.script_cache import ScriptCache
    from streamlit.testing.v1 import app_test

    shared = ScriptCache()
    monkeypatch.setattr(app_test, "ScriptCache", lambda: shared)
    runtime = MagicMock(spec=Runtime)  # what AppTest's own mock holds
    runtime.media_file_mgr = app_test.MediaFileManager(app_test.MemoryMediaFileStorage("/mock/media"))
    runtime.dataframe_source_mgr = app_test.DataframeSourceManager()
    runtime.cache_storage_manager = app_test.MemoryCacheStorageManager()
    runtime.bidi_component_registry = BidiComponentManager()
    monkeypatch.setattr(Runtime, "instance", classmethod(lambda cls: runtime))
    monkeypatch.setattr(Runtime, "exists", classmethod(lambda cls: True))


def app_error_text(at) -> str:
    """The st.error messages of an AppTest run as one string (it must show one, and no exception)."""
    assert not at.exception, [e.value for e in at.exception]
    assert at.error, "expected an st.error"
    return " ".join(e.value for e in at.error)


def sweep_one_cell(at, multiple: int, method: str = "none") -> None:
    """On the Sweep page under AppTest: one length (``multiple`` x L_tr), depth 50 %, one method, one seed; start it."""
    at.multiselect(key="sw_lengths").set_value([multiple])
    at.multiselect(key="sw_depths").set_value([50])
    at.multiselect(key="sw_methods").set_value([method])
    at.number_input(key="sw_seeds").set_value(1)
    at.button(key="sw_start").click().run()


@contextlib.contextmanager
def browser_requests(**fields):
    """AppTest's runner sends its reruns with ``fields`` of Streamlit's ``RerunData`` while inside, as a browser
    does: ``fragment_id_queue=[id]`` (a fragment's rerun), ``is_history_navigation=True`` (back/forward)."""
    from streamlit.testing.v1 import local_script_runner as lsr

    plain = lsr.RerunData
    lsr.RerunData = functools.partial(plain, **fields)
    try:
        yield
    finally:
        lsr.RerunData = plain


def app_ok(at) -> None:
    """An AppTest run showed neither an exception nor an st.error (the message list is the failure text)."""
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]


@pytest.fixture
def one_thread():
    """One intra-op thread while a test runs: tiny-model passes on a busy 2-core machine are much faster so
    (two threads wait on each other more than they compute; see tests/experiments/test_batch.py)."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def unpack_payload(payload: bytes) -> tuple[dict, dict]:
    """A scrubber payload (:mod:`core.views.frames`) read back the way ``unpack`` in ui/scrubber.js reads it: the header
    and every array, the arrays by their JSON path (``"frames.3.map"``).

    ``b"AAEF" | uint32 (little-endian) header length n | header JSON | padding to a multiple of 8 | blobs``; an
    array's entry ``{"off", "shape", "dtype"}`` counts ``off`` from the start of the blobs, ``u8`` or ``f32``.
    """
    import struct

    import numpy as np

    if payload[:4] != b"AAEF":
        raise ValueError("not a scrubber payload")
    (n,) = struct.unpack("<I", payload[4:8])
    header = json.loads(payload[8 : 8 + n].decode("utf-8"))
    start = 8 + n + (-(8 + n)) % 8
    dtypes = {"u8": np.dtype("<u1"), "f32": np.dtype("<f4")}
    arrays: dict = {}

    def walk(node, path: str) -> None:
        if isinstance(node, dict):
            if set(node) == {"off", "shape", "dtype"}:
                assert node["off"] % 8 == 0, f"{path}: offset {node['off']} is not 8-byte aligned"
                count = int(np.prod(node["shape"])) if node["shape"] else 1
                a = np.frombuffer(payload, dtype=dtypes[node["dtype"]], count=count, offset=start + node["off"])
                arrays[path] = a.reshape(node["shape"])
                return
            for k, v in node.items():
                walk(v, f"{path}.{k}" if path else str(k))
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, f"{path}.{i}")

    walk(header, "")
    return header, arrays


def scrubber_view(at) -> tuple[dict, dict]:
    """Explore's scrubber on an AppTest page: the payload's header and the frame of the tau on the slider.

    The frame is the grid frame of that tau, or the exact frame when the tau is off the grid (None while its
    pass is still to come). These are the numbers the browser paints (:mod:`core.views.frames`).
    """
    (el,) = at.get("bidi_component")
    header, _ = unpack_payload(el.proto.bytes)
    meta = header["meta"]
    at_value = meta.get("value", meta["tau"])  # the slider's value: tau, or CosScale s on that axis
    chosen = header["frames"].get(f"{at_value:.2f}") or header["exact"]
    return header, chosen


def wait_until(pred, timeout: float = 180.0) -> None:
    """Poll ``pred`` every 50 ms until it is true; fail after ``timeout`` seconds (background work in tests)."""
    import time

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return
        time.sleep(0.05)
    raise AssertionError("timed out")


def build_tiny_rope(
    folder,
    *,
    layers: int = 2,
    heads: int = 4,
    hidden: int = 64,
    seed: int = 0,
    cosine: float | None = None,
    train_length: int = 64,
    global_every: int = 1,
    card: bool = True,
):
    """Save a random tiny ModernBERT masked-LM (rotary, global attention in every layer unless ``global_every``
    says otherwise) and a card.json to ``folder``. Its tokenizer is the bundled models' BPE (2,048 tokens) with a
    ``<mask>`` token added, so held-out corpus text tokenises as it does for the bundled T5s; ``cosine``: CosScale s.
    q (the first third of the fused Wqkv) is scaled up so random attention has structure a tau can sharpen, and the
    output projection W_o so that what attention does shows in the logits (the residual stream drowns it otherwise)."""
    from pathlib import Path

    from transformers import AutoTokenizer, ModernBertConfig, ModernBertForMaskedLM

    torch.manual_seed(seed)
    tok = AutoTokenizer.from_pretrained(Path(__file__).resolve().parent.parent / "assets" / "models" / "retrieval-t5")
    tok.add_special_tokens({"mask_token": "<mask>"})
    eos, pad = tok.eos_token_id, tok.pad_token_id
    cfg = ModernBertConfig(
        vocab_size=len(tok) + (-len(tok)) % 8,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        global_attn_every_n_layers=global_every,
        local_attention=16,
        max_position_embeddings=8192,
        pad_token_id=pad,
        bos_token_id=eos,
        eos_token_id=eos,
        cls_token_id=eos,
        sep_token_id=eos,
        mask_token_id=tok.mask_token_id,
        attention_dropout=0.0,
        embedding_dropout=0.0,
        mlp_dropout=0.0,
    )
    if cosine is not None:
        cfg.cosine_attention = True
        cfg.cosine_scale = float(cosine)
    model = ModernBertForMaskedLM(cfg)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.attn.Wqkv.weight[:hidden].mul_(6.0)
            layer.attn.Wo.weight.mul_(20.0)
    model.save_pretrained(folder, safe_serialization=True)
    tok.save_pretrained(folder)
    if card:
        (Path(folder) / "card.json").write_text(json.dumps({"train_length": train_length, "tasks": ["mlm"]}))
    return folder


def bench_module(name: str):
    """bench/<name>.py loaded as a module (bench/ is a folder of scripts, not a package)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "bench" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"bench_{name}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


#: Test modules run twice: once as the machine runs (the fused CPU kernel where it builds) and once with the
#: kernel off (``AAE_FUSED_SOFTMAX=0``: torch's path, what a machine without a compiler runs). Why: CI has g++,
#: so without this the fallback's engine, attention and golden numbers would never be run end to end (issue 49).
KERNEL_BOTH_WAYS = {"test_golden_outputs", "test_engine", "test_attention"}


def pytest_generate_tests(metafunc):
    if metafunc.module.__name__.rsplit(".", 1)[-1] in KERNEL_BOTH_WAYS:
        metafunc.fixturenames.append("_kernel_path")
        metafunc.parametrize("_kernel_path", ["kernel", "no-kernel"], indirect=True)


@pytest.fixture
def _kernel_path(request, monkeypatch):
    from core.mechanics import fused_softmax

    if request.param == "no-kernel":
        monkeypatch.setenv(fused_softmax.ENV_SWITCH, "0")
    return request.param


# -- adaptive temperature's reference (Velickovic et al. 2024), numpy, float64 --------------------------------------


def adaptive_beta(entropy):
    """Adaptive temperature's inverse temperature per row from the row's tau = 1 entropy H (nats):
    ``beta = max(poly(H), 1)`` where H > 0.5, else 1 (it never softens), the paper's fit
    (:data:`core.values.schedule.ADAPTIVE_POLY`). The attention computes it in torch
    (:func:`core.mechanics.softmax_block.adaptive_rows`); this is the tests' reference."""
    import numpy as np

    from core.values.schedule import ADAPTIVE_MIN_ENTROPY, ADAPTIVE_POLY

    h = np.asarray(entropy, dtype=np.float64)
    return np.where(h > ADAPTIVE_MIN_ENTROPY, np.maximum(np.polyval(ADAPTIVE_POLY, h), 1.0), 1.0)


def adaptive_softmax(logits):
    """The paper's ``adaptive_temperature_softmax`` over the last axis (numpy, float64): softmax, the row's
    entropy (with its 1e-9 inside the log), beta from :func:`adaptive_beta`, softmax of logits x beta."""
    import numpy as np

    z = np.asarray(logits, dtype=np.float64)

    def softmax(x):
        e = np.exp(x - x.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)

    p = softmax(z)
    h = np.sum(-p * np.log(p + 1e-9), axis=-1, keepdims=True)
    return softmax(z * adaptive_beta(h))


# ---- the two tiers --------------------------------------------------------------------------------------------------
#
# `python -m pytest -q` runs the fast tier: every test not marked ``slow``. `python -m pytest -q --all` (what .ci/run
# runs) adds the slow tier: real browsers, training, Ray clusters and other long passes. Naming files or node ids on
# the command line runs what was named, slow or not: the person chose it.

SLOW_HELP = "browser, training, cluster and long tests: run with --all (.ci/run does)"


def pytest_addoption(parser):
    parser.addoption(
        "--all", action="store_true", default=False, help=f"run the whole suite, slow tier too ({SLOW_HELP})"
    )


def pytest_configure(config):
    config.addinivalue_line("markers", f"slow: {SLOW_HELP}")


#: Folders whose every test is slow: a real browser serving the app, or a model trained.
SLOW_FOLDERS = ("browser", "training")


def pytest_collection_modifyitems(config, items):
    here = Path(__file__).resolve().parent
    for item in items:
        parts = Path(item.path).resolve().relative_to(here).parts
        if parts and parts[0] in SLOW_FOLDERS:
            item.add_marker(pytest.mark.slow)
    named = config.args_source == pytest.Config.ArgsSource.ARGS
    if config.getoption("--all") or named:
        return
    slow = [item for item in items if item.get_closest_marker("slow") is not None]
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [item for item in items if item.get_closest_marker("slow") is None]


# -- the app's caches ---------------------------------------------------------------------------------------------


def clear_app_caches() -> None:
    """Forget every background wish of the app's prefetcher, then every cached document, run and calibration
    (models stay loaded). Wishes first: a wish left behind would refill the emptied stores."""
    from ui import prefetch, stores

    prefetch.prefetcher().forget()
    stores.clear()


def memory_bounds() -> dict:
    """The app's stores' bounds (entries, bytes) and what each holds now, and the totals:
    ``{"stores": {name: {"max_entries", "max_bytes", "entries", "bytes", "evictions", "oversize"}},
    "total_max_bytes", "total_bytes"}``."""
    from ui import stores

    per = {k: v.usage() for k, v in stores.stores().items()}
    return {
        "stores": per,
        "total_max_bytes": sum(u["max_bytes"] or 0 for u in per.values()),
        "total_bytes": sum(u["bytes"] for u in per.values()),
    }


#: Seconds past a stated bound after which a bounded wait counts as hung rather than slow. Tests check what a bounded
#: wait does (it gives up, says why in one line, and waited its bound where that is the point); how far past its
#: bound it finished is a figure for bench/bounds.py, since a busy 2-core machine stretches it.
HANG_S = 120.0
