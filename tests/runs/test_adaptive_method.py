"""Adaptive temperature as a registry method (issue 48, point 4): ``adaptive`` resolves to the one adaptive
schedule (:data:`core.values.schedule.ADAPTIVE`), which travels as the run's tau like any other schedule.

Each check can fail on wrong code: the CLI's numbers against an independent float64 reference attention
(tests/mechanics/test_adaptive_temperature.py's, nothing of ours) and against tau = 1; the app's run store keyed apart from
tau = 1 (an adaptive pass keyed as tau = 1 would be served the tau = 1 numbers); a reference pass (L_tr) of an
adaptive choice at plain tau = 1; sweeps and batch runs carrying it; settings files round-tripping it.
"""

from __future__ import annotations

import copy
import csv
import json
import pickle

import pytest
import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from core import cli
from core.errors import UserError
from core.mechanics import attention
from core.runs import engine, methods
from core.runs.settings import DocumentRequest, Settings
from core.values.choice import TRAINED, Choice
from core.values.schedule import ADAPTIVE, ONE, Schedule
from support.reference import REF, adaptive_reference

pytestmark = pytest.mark.usefixtures("one_thread")

#: the registry's adaptive entry, found by what it holds (the registry owns the name)
NAME = next(n for n, m in methods.REGISTRY.items() if m.constant is not None and m.constant.adaptive)
TOKENS = 600  # past the tiny model's L_tr (256): dispersed rows, which adaptive temperature sharpens


# -- the schedule ------------------------------------------------------------------------------------------------


def test_the_adaptive_schedule_is_one_value_with_its_own_key():
    assert Schedule.of({"scheme": "adaptive"}) is ADAPTIVE and Schedule.of(ADAPTIVE) is ADAPTIVE
    assert ADAPTIVE.to_json() == {"scheme": "adaptive"} and ADAPTIVE.adaptive and not ONE.adaptive
    assert ADAPTIVE.key() != ONE.key() and ADAPTIVE != ONE and ONE != ADAPTIVE and hash(ADAPTIVE) != hash(ONE)
    assert not ADAPTIVE.is_one and ADAPTIVE.scalar is None  # not tau = 1, and not one number (no grid frame)
    with pytest.raises(TypeError):
        float(ADAPTIVE)
    # its base tau before each row's beta: 1 everywhere (what a result's tau matrix and the CSV's tau report)
    assert ADAPTIVE.heads(0, 4) is None and (ADAPTIVE.matrix(2, 4, rows=10) == 1).all() and ADAPTIVE.mean(10) == 1
    assert "adaptive" in ADAPTIVE.describe()
    assert pickle.loads(pickle.dumps(ADAPTIVE)) is ADAPTIVE and copy.deepcopy(ADAPTIVE) is ADAPTIVE
    with pytest.raises(ValueError, match="no parameters"):
        Schedule.of({"scheme": "adaptive", "floor_scale": 256})


def test_the_registry_entry_is_the_adaptive_schedule(tiny):
    m = methods.get(NAME)
    assert m.constant is ADAPTIVE and not m.measured and not m.length_dependent and m.passes(2, 4) == (0, 0)
    assert methods.resolve(tiny, None, NAME) == (ADAPTIVE, {"source": NAME})
    assert methods.AS_TRAINED != NAME and methods.parse(NAME) == (NAME, None) and methods.spell(NAME) == NAME


def test_a_reference_choice_drops_it():
    choice = Choice.of(NAME, ADAPTIVE)
    ref = choice.with_(method=methods.AS_TRAINED, tau=ONE)
    assert not ref.tau.adaptive and ref.tau == ONE and ref.with_(method=None) == TRAINED
    with attention.attention_call(choice):
        assert attention.current_call().choice.tau.adaptive
    assert Choice.of(tau=ADAPTIVE).tau.adaptive


def test_the_attention_settings_flag_is_gone():
    """One way to ask for it: the schedule (an ``adaptive=True`` part is refused)."""
    with pytest.raises(TypeError, match="adaptive"):
        TRAINED.with_(adaptive=True)


def test_a_settings_file_carries_it(tmp_path):
    s = Settings(method=NAME)
    back = Settings.from_dict(json.loads(s.to_json()))
    assert back.method == NAME and back.to_choice().tau is ADAPTIVE
    # a schedule handed over as it is (a settings file's tau, core.runs.apply): the schedule decides, not the name
    fixed = Settings.from_dict({"method": methods.FIXED, "tau": {"scheme": "adaptive"}})
    assert fixed.to_choice().tau is ADAPTIVE


# -- the CLI against an independent reference ---------------------------------------------------------------------


def _cli_json(capsys, *argv) -> dict:
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out)


def _reference_stats(loaded, text: str) -> tuple[float, float]:
    """Mean Pmax and entropy (nats) over the encoder's layers, heads and rows, from the weights of the paper's
    adaptive softmax written out in float64 (tests/mechanics/test_adaptive_temperature.py's reference, registered with
    transformers: nothing of ours computes them)."""
    AttentionInterface.register(REF, adaptive_reference)
    AttentionMaskInterface.register(REF, sdpa_mask)
    ids = torch.tensor([loaded.tokenizer(text).input_ids])
    model = loaded.model
    before = attention.point(model, REF)
    try:
        with torch.no_grad():
            out = model.get_encoder()(input_ids=ids, output_attentions=True)
    finally:
        attention.point_back(before)
    w = torch.stack([a[0] for a in out.attentions]).double()  # [layers, heads, L, L]
    assert w.shape[0] == loaded.n_layers and w.shape[-1] == ids.shape[1]
    pmax = w.amax(-1).mean().item()
    ent = -(torch.xlogy(w, w)).sum(-1).mean().item()
    return pmax, ent


def test_run_method_adaptive_matches_an_independent_reference(tiny_dir, tiny, capsys):
    base = ("run", "--model", tiny_dir, "--task", "passkey", "--tokens", TOKENS, "--json")
    got = _cli_json(capsys, *base, "--method", NAME)
    plain = _cli_json(capsys, *base, "--method", methods.AS_TRAINED)
    assert got["method"] == NAME and got["tokens"] == plain["tokens"]
    doc = DocumentRequest(task="passkey", tokens=TOKENS).build_for(tiny)
    assert len(tiny.tokenizer(doc.text).input_ids) == got["tokens"]  # the very document the CLI ran
    pmax, ent = _reference_stats(tiny, doc.text)
    assert got["pmax"] == pytest.approx(pmax, rel=1e-4) and got["entropy"] == pytest.approx(ent, rel=1e-4)
    # and not the tau = 1 numbers: adaptive temperature sharpened the dispersed rows
    assert got["pmax"] > plain["pmax"] * 1.05 and got["entropy"] < plain["entropy"] * 0.95


# -- the app's stores ---------------------------------------------------------------------------------------------


def test_the_apps_run_store_keeps_adaptive_apart_from_tau_1(tiny):
    pytest.importorskip("streamlit")
    from ui import cache

    req = DocumentRequest(task="passkey", tokens=TOKENS, depth=0.5, seed=7)
    probes = cache.explore_probes(tiny.n_layers - 1, None)
    how = engine.Pass(probes=probes)
    one = Choice.of(methods.AS_TRAINED, ONE)
    ada = Choice.of(NAME, methods.resolve(tiny, None, NAME)[0])
    assert cache.run_key(tiny, req, one, how) != cache.run_key(tiny, req, ada, how)
    assert cache.attention_key(one) != cache.attention_key(ada)
    first = cache.run(
        tiny, req, one, how
    )  # tau = 1 first: a store keyed by the name-less schedule would serve it again
    second = cache.run(tiny, req, ada, how)
    assert second.method == NAME
    assert second.pmax > first.pmax * 1.05 and second.entropy < first.entropy * 0.95
    # the same numbers as a pass of the engine itself with the adaptive schedule (not the stored tau = 1 pass)
    direct = engine.run(tiny, cache.document(tiny, req), ada, how)
    assert second.pmax == pytest.approx(direct.pmax, rel=1e-6) and second.entropy == pytest.approx(
        direct.entropy, rel=1e-6
    )


def test_a_reference_pass_of_an_adaptive_choice_runs_at_tau_1(tiny):
    """L_tr's reference (what the meters and Algorithm 1 compare with) is the model as trained, whatever the
    chosen method: run_reference replaces the schedule by ONE, and with it adaptive temperature."""
    pytest.importorskip("streamlit")
    from ui import cache

    req = DocumentRequest(task="passkey", tokens=TOKENS, depth=0.5, seed=8)
    base = Choice.of(NAME, ADAPTIVE)
    ref = cache.run_reference(tiny, req, base)
    doc = cache.reference_document(tiny, req)
    probes = cache.explore_probes(tiny.n_layers - 1, None)
    plain = engine.run(tiny, doc, TRAINED, engine.Pass(probes=probes, generate=False))
    adaptive = engine.run(tiny, doc, base, engine.Pass(probes=probes, generate=False))
    assert ref.pmax == pytest.approx(plain.pmax, rel=1e-6) and ref.entropy == pytest.approx(plain.entropy, rel=1e-6)
    assert abs(adaptive.pmax - plain.pmax) > 1e-3  # the check can fail: adaptive would have changed it


# -- sweeps and batch runs ----------------------------------------------------------------------------------------


def test_a_sweep_runs_it_beside_tau_1(tiny_dir, tmp_path):
    out = tmp_path / "sweep.csv"
    code = cli.main(
        [
            "sweep",
            "--model",
            str(tiny_dir),
            "--task",
            "passkey",
            "--lengths",
            str(TOKENS),
            "--methods",
            f"{methods.AS_TRAINED},{NAME}",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    with open(out, newline="", encoding="utf-8") as f:
        rows = {r["method"]: r for r in csv.DictReader(f)}
    assert set(rows) == {methods.AS_TRAINED, NAME}
    assert float(rows[NAME]["tau"]) == 1.0  # its base tau; the method column says it is adaptive
    assert float(rows[NAME]["pmax"]) > float(rows[methods.AS_TRAINED]["pmax"]) * 1.05


def test_a_batch_run_carries_it(tiny_dir, tmp_path):
    data = tmp_path / "docs.jsonl"
    data.write_text(
        "\n".join(
            json.dumps({"id": i, "text": f"Note {i}: the code word is tulip{i}. " * 40, "expected": f"tulip{i}"})
            for i in range(3)
        )
        + "\n",
        encoding="utf-8",
    )
    rows = {}
    for method in (methods.AS_TRAINED, NAME, methods.PER_ROW):  # a position's per-row schedule: a JSON cell too
        out = tmp_path / f"{method}.csv"
        assert (
            cli.main(["sweep", "--model", str(tiny_dir), "--data", str(data), "--out", str(out), "--method", method])
            == 0
        )
        with open(out, newline="", encoding="utf-8") as f:
            rows[method] = list(csv.DictReader(f))
    assert {r["setting"] for r in rows[NAME]} == {NAME}
    assert json.loads(rows[NAME][0]["tau"]) == ADAPTIVE.to_json()
    assert [float(r["pmax"]) for r in rows[NAME]] != [float(r["pmax"]) for r in rows[methods.AS_TRAINED]]
    assert json.loads(rows[methods.PER_ROW][0]["tau"])["floor_scale"] > 0


def test_a_fixed_method_list_refuses_it_as_a_number():
    with pytest.raises(UserError, match="one number"):
        methods.spell(methods.FIXED, ADAPTIVE)
