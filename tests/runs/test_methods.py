"""core.runs.methods: one registry entry per temperature method, read by every list and every resolution."""

from __future__ import annotations

import argparse
import math

import numpy as np
import pytest

from core.data import tasks
from core.errors import UserError
from core.runs import methods, temperature
from core.values.schedule import RowTau, Schedule


@pytest.fixture(scope="module")
def doc(tiny):
    return tasks.make("passkey", tiny.tokenizer, 600, depth=0.5, seed=1)


def test_every_entry_is_complete_and_the_flags_agree():
    assert methods.NAMES[:2] == ("none", "fixed") and len(set(methods.NAMES)) == len(methods.NAMES)
    for m in methods.REGISTRY.values():
        assert m.label and m.short and m.help, m.name
        assert methods.label(m.name) == m.label
        if m.measured:
            assert m.length_dependent, m.name  # a pass at one length says nothing at another
        if m.stats:
            assert m.measured and m.formula is not None, m.name
    assert set(methods.FORMULAS) == {
        "log-length",
        "yarn",
        "log-n",
        "ssmax",
        "infoscale",
        "longrope",
        "critical",
        "prop1",
        "prop2",
    }
    assert methods.label("tau=0.7") == "tau=0.7"
    with pytest.raises(UserError, match="Unknown method 'nope'"):
        methods.get("nope")


def test_yarn_and_llama4_by_hand():
    # YaRN: tau = (0.1 ln s + 1)^-2, s = L / L_tr; at s = 8: 1 / (0.1 * 2.0794 + 1)^2 = 0.6854
    assert methods.formula("yarn", 256, 8 * 256, 32) == pytest.approx(0.6854, abs=1e-4)
    assert methods.formula("yarn", 256, 200, 32) == 1.0  # never softens below L_tr
    # Llama 4: queries x log1p(floor((pos + 1) / floor_scale)) * attn_scale + 1, so row tau is its inverse; at
    # pos = 4 L_tr - 1 (the 4 L_tr-th token), floor_scale = L_tr, attn_scale = 0.1: tau = 1 / (1 + 0.1 ln 5)
    rows = RowTau(floor_scale=256, attn_scale=0.1)
    assert rows.taus([4 * 256 - 1])[0] == pytest.approx(1 / (1 + 0.1 * math.log(5)))
    assert rows.taus([254])[0] == 1.0  # before L_tr: unscaled


def test_llama4_rows_are_the_inverse_of_transformers_own_query_scale():
    """RowTau (what the attention divides each row by) against transformers' Llama4TextAttention itself: a NoPE
    layer with attn_temperature_tuning multiplies the query of row p by a factor; tau must be 1 / that factor."""
    torch = pytest.importorskip("torch")
    llama4 = pytest.importorskip("transformers.models.llama4.modeling_llama4")
    from transformers import AttentionInterface, Llama4TextConfig

    seen = {}

    def capture(module, query, key, value, attention_mask, **kwargs):
        seen["q"] = query.detach().clone()
        return torch.zeros(query.shape[0], query.shape[2], query.shape[1], query.shape[3]), None

    AttentionInterface.register("capture_llama4_q", capture)
    floor_scale, attn_scale, n = 16, 0.3, 100
    cfg = Llama4TextConfig(
        hidden_size=4,
        num_attention_heads=1,
        num_key_value_heads=1,
        head_dim=4,
        intermediate_size=8,
        intermediate_size_mlp=8,
        num_hidden_layers=1,
        no_rope_layers=[0],
        attn_temperature_tuning=True,
        floor_scale=floor_scale,
        attn_scale=attn_scale,
    )
    cfg._attn_implementation = "capture_llama4_q"
    attn = llama4.Llama4TextAttention(cfg, 0)
    assert not attn.use_rope and attn.attn_temperature_tuning  # the layer where Llama 4 tunes the temperature
    with torch.no_grad():
        attn.q_proj.weight.copy_(torch.eye(4))
        attn.forward(torch.ones(1, n, 4), None, None)
    factor = seen["q"][0, 0, :, 0].double().numpy()  # every query is all ones before the scale
    np.testing.assert_allclose(RowTau(floor_scale, attn_scale).taus(np.arange(n)), 1 / factor, rtol=1e-6)
    assert (
        factor[floor_scale - 2] == 1.0 and factor[floor_scale - 1] > 1.0
    )  # the first sharpened row: p = floor_scale - 1


def test_log_n_and_ssmax_equal_log_length_in_an_encoder():
    """Every encoder row sees all L keys, so Qwen's log_{L_tr} n and SSMax's s log n with s log L_tr = 1 give
    tau = log L_tr / log L at every length: the same number as log-length (and 1 up to L_tr)."""
    for n in (100, 256, 257, 1024, 4096, 65_536):
        want = min(1.0, math.log(256) / math.log(n))
        for name in ("log-n", "ssmax", "log-length"):
            assert methods.formula(name, 256, n, 32) == pytest.approx(want, rel=1e-12), (name, n)


def test_llama4_rows_by_hand():
    r = RowTau(floor_scale=256)
    # row 4 L_tr - 1 (the 4 L_tr-th token): tau = 1 / (1 + 0.1 ln 5); rows before L_tr - 1: 1
    np.testing.assert_allclose(
        r.taus([0, 254, 255, 1023, 2047]),
        [1, 1, 1 / (1 + 0.1 * math.log(2)), 1 / (1 + 0.1 * math.log(5)), 1 / (1 + 0.1 * math.log(9))],
    )
    assert r.mean(256) == pytest.approx((255 + 1 / (1 + 0.1 * math.log(2))) / 256)


def test_formulas_are_the_papers():
    lt, n, d = 256, 2048, 16
    st = {"sigma_tr": 1.1, "sigma_ex": 1.3, "pmax_tr": 0.4}
    assert methods.formula("log-length", lt, n, d) == pytest.approx(math.log(lt) / math.log(n))
    assert methods.formula("infoscale", lt, n, d) == pytest.approx(temperature.infoscale(lt, n, d))
    assert methods.formula("prop1", lt, n, d, st) == pytest.approx(temperature.prop1(lt, n, 0.4, 1.1, 1.3))
    assert methods.formula("prop2", lt, n, d, st) == pytest.approx(temperature.prop2(lt, n, 1.1, 1.3))
    with pytest.raises(UserError, match="logit statistics"):
        methods.formula("prop2", lt, n, d)
    with pytest.raises(UserError, match="no closed form"):
        methods.formula("pmax", lt, n, d)
    with pytest.raises(UserError, match="prop1"):  # a negative discriminant: the quadratic has no real root
        methods.formula("prop1", lt, n, d, {"sigma_tr": 1.1, "sigma_ex": 2.0, "pmax_tr": 1.0})


def test_every_method_resolves_through_its_entry(tiny, doc):
    n = len(tiny.tokenizer(doc.text).input_ids)
    L, H = tiny.n_layers, tiny.n_heads
    for name, m in methods.REGISTRY.items():
        if m.takes_value:
            with pytest.raises(UserError, match="needs a tau"):
                methods.resolve(tiny, doc, name)
            assert methods.resolve(tiny, doc, name, tau=0.8) == (Schedule.of(0.8), {"source": name})
            continue
        if m.constant is not None:  # tau = 1, or adaptive temperature (its rows' taus come from the pass itself)
            assert methods.resolve(tiny, doc, name) == (m.constant, {"source": name})
            assert m.constant.is_one or m.constant.adaptive, name
            continue
        try:
            tau, info = methods.resolve(tiny, doc, name)
        except UserError as err:  # a closed form without an answer on this random model says why
            assert m.stats and name in str(err)
            continue
        assert isinstance(tau, Schedule), name
        if m.per == "row":  # one tau per query row, from L_tr alone
            assert tau.rows is not None and tau.rows.floor_scale == tiny.train_length, name
            assert tau == Schedule.of(RowTau(floor_scale=tiny.train_length, scheme=tau.rows.scheme)), name
            assert info["mean_tau"] == pytest.approx(tau.mean(n)) and info["mean_tau"] < 1
            continue
        a = tau.matrix(L, H)
        assert np.all(np.isfinite(a)) and np.all(a > 0), name
        assert tau.ndim == m.ones(L, H).ndim, name  # the shape the entry says it gives
        if m.length_dependent:
            assert info["source"] == "resolved" and info["length"] == n, name
            # a stored schedule is reused only at the length it was chosen at
            assert methods.resolve(tiny, doc, name, tau=0.9, chosen_at=n) == (
                Schedule.of(0.9),
                {"source": "stored", "chosen_at": n, "length": n},
            )


def test_a_fixed_tau_has_one_text():
    """``tau=0.8`` in a CSV row or a method list, read back to the fixed method and its value; old bare numbers too."""
    for text in ("tau=0.8", "0.8", 0.8):
        name, value = methods.parse(text)
        assert methods.REGISTRY[name].takes_value and value == Schedule.of(0.8)
        assert methods.spell(name, value) == "tau=0.8" == methods.method_label(text)
    for name in methods.NAMES:
        if not methods.REGISTRY[name].takes_value:
            assert methods.parse(name) == (name, None) and methods.spell(name) == name
    for bad in (methods.FIXED, "tau=", "tau=0", "tau=-1", "tau=nan", "tau=1e-300", "1e400", "tau=x", "nonsense"):
        with pytest.raises(ValueError):
            methods.parse(bad)


def test_costs_come_from_the_entries():
    """What a method's resolve runs, in passes, is the entry's own: a search costs more than a closed form,
    per-layer a search per layer, per-head the whole grid per layer; estimates read it (core.runs.timing)."""
    L, H, grid = 4, 8, len(temperature.GRID)
    costs = {n: m.passes(L, H, grid) for n, m in methods.REGISTRY.items()}
    for n, m in methods.REGISTRY.items():
        assert (costs[n] == (0, 0)) == (not m.measured), n
        assert (m.search is not None) <= (costs[n][0] > 2), n  # a search is several passes
    one = max(c[0] for n, c in costs.items() if methods.REGISTRY[n].grid_criterion)
    assert {c[0] for n, c in costs.items() if methods.REGISTRY[n].per == "layer"} == {one * L}
    assert {c[0] for n, c in costs.items() if methods.REGISTRY[n].per == "head"} == {grid * L + 1}
    for n, m in methods.REGISTRY.items():  # more calibration documents: a search runs on each of them
        if m.search is not None:
            assert m.passes(L, H, grid, samples=3) == (3 * costs[n][0], 3 * costs[n][1]), n


def test_a_new_entry_is_all_it_takes(tiny, doc, monkeypatch):
    """Adding a method is one registry entry: resolve, label and formula dispatch through it."""
    new = methods.Method(
        "half-log",
        "half log-length",
        "½ log",
        "Half way between 1 and log-length.",
        measured=False,
        length_dependent=True,
        resolve=None,
        formula=lambda lt, n, d, st: (1 + temperature.log_length(lt, n)) / 2,
    )
    new = methods.Method(
        **{
            **new.__dict__,
            "resolve": lambda loaded, document, tokens, **_: (
                methods.formula("half-log", loaded.train_length, tokens, 0),
                {},
            ),
        }
    )
    monkeypatch.setitem(methods.REGISTRY, "half-log", new)
    n = len(tiny.tokenizer(doc.text).input_ids)
    tau, info = methods.resolve(tiny, doc, "half-log")
    assert tau.scalar == pytest.approx((1 + math.log(tiny.train_length) / math.log(n)) / 2)
    assert info["source"] == "resolved" and methods.label("half-log") == "half log-length"


def test_the_cli_and_the_app_list_the_registry():
    from core import cli

    action = next(
        a
        for g in cli.build_parser()._subparsers._group_actions
        for a in g.choices["run"]._actions
        if a.dest == "method"
    )
    listed = action.help.split("}")[0].removeprefix("{").split(",")
    assert tuple(listed) == tuple(n for n in methods.NAMES if not methods.REGISTRY[n].takes_value)  # a fixed tau: tau=X
    for name in listed + ["tau=0.8"]:
        assert action.type(name) == name
    with pytest.raises(argparse.ArgumentTypeError):
        action.type(methods.FIXED)  # the fixed method always carries its value
