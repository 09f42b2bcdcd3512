"""Issue 47 point 3: a ModernBERT-shaped model whose config says its rotary covers part of the head.

transformers' ModernBERT rotates the whole head (``apply_rotary_pos_emb`` over ``head_dim``) and its default
frequencies ignore ``partial_rotary_factor`` (``compute_default_rope_parameters``), so a model trained that way
with the default rope type is a whole-head rotary model: checked here against transformers itself. Every scheme
must then be built for the dimensions the model rotates (the issue's repro: ``--schemes ntk`` or ``pi`` ended in
"The size of tensor a (16) must match the size of tensor b (8)"), each frequency scheme equal to transformers'
own model built with the scheme's rope parameters for that dimension, every other scheme equal to the same
weights without the factor. A config no transformers ModernBERT can run (a partial rope type of its own, a
``head_dim`` narrower than the attention's head) is one line, exit 2, from the loader (it runs a short pass to
check whose attention serves the model) and from every scheme pass.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from transformers import ModernBertConfig, ModernBertForMaskedLM

from conftest import build_tiny_rope
from core import cli
from core.errors import UserError
from core.mechanics.run_pass import Pass
from core.models import load
from core.runs import methods, rope_pass
from core.values import positions
from core.values.choice import Choice

L_TR = 16
N = 40
HEAD = 16  # build_tiny_rope: hidden 64, 4 heads
FREQUENCY = [n for n in positions.AVAILABLE if positions.FREQUENCIES in positions.get(n).changes]


def _with_rope(folder, **extra) -> None:
    cfg = json.loads((folder / "config.json").read_text())
    for params in cfg["rope_parameters"].values():
        params.update(extra)
    (folder / "config.json").write_text(json.dumps(cfg))


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    """The same weights twice: with ``partial_rotary_factor`` 0.5 in every layer type's rope parameters, and
    without."""
    partial = build_tiny_rope(tmp_path_factory.mktemp("partial-rope"), train_length=L_TR, seed=5)
    whole = build_tiny_rope(tmp_path_factory.mktemp("whole-rope"), train_length=L_TR, seed=5)
    _with_rope(partial, partial_rotary_factor=0.5)
    return partial, whole


@pytest.fixture(scope="module")
def partial(dirs):
    return load(str(dirs[0]), device="cpu")


@pytest.fixture(scope="module")
def whole(dirs):
    return load(str(dirs[1]), device="cpu")


def _ids(n: int = N) -> torch.Tensor:
    return torch.randint(10, 2000, (1, n), generator=torch.Generator().manual_seed(2))


def _ours(loaded, scheme: positions.Scheme, ids: torch.Tensor, probed: bool = False) -> torch.Tensor:
    from core.mechanics.probes import ProbeSpec, Recorder

    rec = Recorder(ProbeSpec.stats_only(), torch.ones(ids.shape, dtype=torch.bool)) if probed else None
    how = Pass(chunk_bytes=4 * 4 * N * 4 * 7)
    with torch.no_grad(), rope_pass.scheme_pass(loaded, Choice.of(tau=1.0, scheme=scheme), how, rec, ids.shape[1]):
        out = loaded.model(input_ids=ids).logits
    if probed:
        rec.finish()
    return out


def test_transformers_modernbert_rotates_the_whole_head_whatever_the_factor(dirs, partial):
    """The ground the fix stands on: transformers' own model from the partial config holds head / 2 frequencies
    (the factor ignored by the default rope) and equals the same weights without the factor; with a rope type
    that honours the factor, transformers' own model cannot run (the issue's error)."""
    folder, plain = dirs
    ref = ModernBertForMaskedLM.from_pretrained(str(folder), attn_implementation="eager").eval()
    other = ModernBertForMaskedLM.from_pretrained(str(plain), attn_implementation="eager").eval()
    assert ref.model.rotary_emb.full_attention_inv_freq.numel() == HEAD // 2
    ids = _ids()
    with torch.no_grad():
        torch.testing.assert_close(ref(input_ids=ids).logits, other(input_ids=ids).logits)
    cfg = ModernBertConfig.from_pretrained(str(folder))
    for params in cfg.rope_parameters.values():
        params.update(rope_type="linear", factor=2.0)
    broken = ModernBertForMaskedLM.from_pretrained(str(folder), config=cfg, attn_implementation="eager").eval()
    with pytest.raises(RuntimeError, match="must match"), torch.no_grad():
        broken(input_ids=ids)
    assert positions.rotary_dim(partial.model.config, "full_attention") == HEAD


@pytest.mark.parametrize("probed", [False, True])
@pytest.mark.parametrize("name", FREQUENCY)
def test_frequency_schemes_equal_transformers_with_the_scheme_s_rope_parameters(dirs, partial, name, probed):
    ids = _ids()
    bound = positions.get(name).bind(L_TR, N)
    cfg = positions.configured(partial.model.config, bound)
    for lt in positions.layer_types(cfg):
        inv, _ = bound.frequencies(partial.model.config, lt)
        assert inv.numel() == HEAD // 2, (name, lt)
    ref = ModernBertForMaskedLM.from_pretrained(str(dirs[0]), config=cfg, attn_implementation="eager").eval()
    assert ref.model.rotary_emb.full_attention_inv_freq.numel() == HEAD // 2
    with torch.no_grad():
        want = ref(input_ids=ids).logits
    got = _ours(partial, positions.Scheme.of(name), ids, probed)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert (got - _ours(partial, positions.PLAIN_SCHEME, ids)).abs().max() > 2e-4


def test_pi_and_ntk_frequencies_by_hand_for_the_rotated_dimension(partial):
    theta = partial.model.config.rope_parameters["full_attention"]["rope_theta"]
    s = N / L_TR
    plain = 1.0 / theta ** (torch.arange(0, HEAD, 2).double() / HEAD)
    pi, _ = positions.get("pi").bind(L_TR, N).frequencies(partial.model.config, "full_attention")
    ntk, _ = positions.get("ntk").bind(L_TR, N).frequencies(partial.model.config, "full_attention")
    torch.testing.assert_close(pi.double(), plain / s, rtol=1e-6, atol=0)
    big = theta * s ** (HEAD / (HEAD - 2))
    torch.testing.assert_close(ntk.double(), 1.0 / big ** (torch.arange(0, HEAD, 2).double() / HEAD), rtol=1e-6, atol=0)


@pytest.mark.parametrize("name", [n for n in positions.AVAILABLE if n not in FREQUENCY])
def test_every_other_scheme_equals_the_same_weights_without_the_factor(partial, whole, name):
    ids = _ids()
    params = {"window": 5} if "window" in positions.get(name).params else {}
    scheme = positions.Scheme.of(name, params)
    for probed in (False, True):
        torch.testing.assert_close(
            _ours(partial, scheme, ids, probed), _ours(whole, scheme, ids, probed), rtol=1e-5, atol=1e-5
        )


def test_cli_mlm_every_scheme_on_the_partial_model(dirs, capsys):
    rc = cli.main(
        [
            "mlm",
            "--model",
            str(dirs[0]),
            "--lengths",
            "1x,2x",
            "--schemes",
            ",".join(positions.AVAILABLE),
            "--methods",
            methods.AS_TRAINED,
            "--sequences",
            "1",
            "--json",
        ]
    )
    out = capsys.readouterr()
    assert rc == 0, out.err
    rows = json.loads(out.out)["rows"]
    assert len(rows) == 2 * len(positions.AVAILABLE)
    assert all(math.isfinite(r["nll"]) for r in rows)


@pytest.mark.parametrize(
    "extra",
    [
        {"rope_type": "linear", "factor": 2.0, "partial_rotary_factor": 0.5},
        {"rope_type": "yarn", "factor": 2.0, "partial_rotary_factor": 0.5, "original_max_position_embeddings": 16},
    ],
)
def test_a_config_transformers_cannot_run_is_one_line(tmp_path, capsys, extra):
    folder = build_tiny_rope(tmp_path / "m", train_length=L_TR, seed=6)
    _with_rope(folder, **extra)
    rc = cli.main(
        [
            "mlm",
            "--model",
            str(folder),
            "--lengths",
            "1x",
            "--schemes",
            "none,ntk",
            "--methods",
            methods.AS_TRAINED,
            "--sequences",
            "1",
            "--json",
        ]
    )
    out = capsys.readouterr()
    lines = [line for line in out.err.splitlines() if line.strip()]
    assert rc == 2 and out.out == "", out.err
    assert len(lines) == 1 and lines[0].startswith("error: ") and "rotar" in lines[0], out.err


def test_a_head_dim_narrower_than_the_head_is_one_line(tmp_path):
    folder = build_tiny_rope(tmp_path / "m", train_length=L_TR, seed=6)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["head_dim"] = 8
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UserError, match="rotar"):  # refused by the loader, before its first pass
        load(str(folder), device="cpu")
