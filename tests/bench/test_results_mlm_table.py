"""bench/results.py's masked-token table (issue 38; the InfoScale paper's Table 1) on tiny rotary models at 1x and
2x with few masked positions: one row per model x length x scheme x method with its variant, at least the asked
masked positions per cell, resumed to exactly one row per cell, and the markdown with the paper's numbers beside."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest

from conftest import build_tiny_rope
from core.experiments import mlm
from core.models import load
from core.runs import methods, temperature
from core.values import positions

ROOT = Path(__file__).resolve().parents[2]
L_TR = 32
SCHEMES = (positions.PLAIN, "window")

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def rb():
    spec = importlib.util.spec_from_file_location("bench_results_mlm", ROOT / "bench" / "results.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    base = tmp_path_factory.mktemp("bench-mlm")
    dot = build_tiny_rope(base / "dot", layers=1, hidden=32, train_length=L_TR, seed=1)
    cos = build_tiny_rope(base / "cos", layers=1, hidden=32, train_length=L_TR, seed=2, cosine=16.0)
    return str(dot), str(cos)


def test_infoscale_is_the_registry_entry_asked_by_what_it_is(rb):
    name = rb.infoscale_method()
    entry = methods.get(name)
    assert entry.formula(64, 4096, 32, None) == pytest.approx(temperature.infoscale(64, 4096, 32))
    assert entry.formula(64, 4096, 32, None) == pytest.approx(
        math.sqrt((1 - 64 ** (-2 / 32)) / (1 - 4096 ** (-2 / 32)))
    )
    assert entry.label == "InfoScale"


def test_sequences_per_cell_give_the_masked_positions_asked(rb, models):
    loaded = load(models[0], device="cpu")
    for n, want in ((32, 500), (64, 500), (2048, 500), (64, 7)):
        k = rb.mlm_sequences(loaded, n, want)
        counts = {len(mlm.sequence(loaded, n, seed)[1].positions) for seed in range(3)}
        assert len(counts) == 1  # every sequence at n has the same count: the first one's holds for the cell
        per = counts.pop()
        assert per == round(0.15 * (n - 1))  # n tokens, one of them special (this tokenizer's end of sequence)
        assert k * per >= want and (k - 1) * per < want


def test_the_table_rows_resume_and_markdown(rb, models, tmp_path):
    dot, cos = models
    out = tmp_path / "out"
    df = rb.run_mlm_table(dot, cos, [1, 2], out, SCHEMES, min_masked=12, seed=3, batch=4)
    assert len(df) == 2 * 2 * len(SCHEMES) * 2  # models x lengths x schemes x (as trained, InfoScale)
    assert (df["masked"].astype(int) >= 12).all()
    assert set(df["first_seed"].astype(int)) == {3}
    cells = df.groupby(["tokens", "scheme", "variant"]).size()
    assert len(cells) == 2 * len(SCHEMES) * 4 and (cells == 1).all()
    assert set(df["variant"]) == set(rb.MLM_VARIANTS)
    cs = df[df["variant"] == "C.S."]
    assert (cs["cosine_scale"].astype(float) == 16.0).all()  # the cosine model at its trained s, every length
    plain = df[df["variant"] == "none"]
    assert (plain["tau"].astype(float) == 1.0).all() and (plain["cosine_scale"] == "").all()
    inf = df[(df["variant"] == "I.S.") & (df["tokens"].astype(int) == 2 * L_TR)]
    d = load(dot).model.config.hidden_size // load(dot).model.config.num_attention_heads
    n = 2 * L_TR  # the paper's InfoScale (epsilon = 0) by hand: logits x sqrt((1 - n^(-2/d)) / (1 - n_tr^(-2/d)))
    scale = math.sqrt((1 - n ** (-2 / d)) / (1 - L_TR ** (-2 / d)))
    assert float(inf["tau"].iloc[0]) == pytest.approx(1 / scale, abs=1e-6) and scale > 1

    # killed mid-way: the last row torn off the cosine model's CSV; the rerun adds it once and nothing else
    csv = rb.mlm_csv(out, cos)
    whole = csv.read_bytes()
    csv.write_bytes(whole[: whole.rstrip(b"\n").rfind(b"\n") + 1 + 5])  # half a line at the end
    again = rb.run_mlm_table(dot, cos, [1, 2], out, SCHEMES, min_masked=12, seed=3, batch=4)
    assert len(again) == len(df) and csv.read_bytes().count(b"\n") == whole.count(b"\n")
    keys = ["tokens", "scheme", "variant"]
    a = df.sort_values(keys)[keys + ["accuracy", "perplexity", "masked"]].astype(str).reset_index(drop=True)
    b = again.sort_values(keys)[keys + ["accuracy", "perplexity", "masked"]].astype(str).reset_index(drop=True)
    assert a.equals(b)

    md = (out / "mlm-table.md").read_text()
    assert "1x (32)" in md and "2x (64)" in md
    for variant in rb.MLM_VARIANTS:
        assert f"| {positions.get('window').label} | {variant} |" in md
    r = df[(df["variant"] == "C.S. + I.S.") & (df["scheme"] == "window") & (df["tokens"].astype(int) == 64)].iloc[0]
    assert f"{float(r['perplexity']):.2f} / {float(r['accuracy']):.2f}" in md
    # the paper's numbers beside: W.A. at 2x its L_tr (128 tokens) with C.S. + I.S. is 2.17 / 0.84 (Table 1)
    assert "| W.A. | C.S. + I.S. | – | 2.17 / 0.84 |" in md
    assert "| GAU-α (plain RoPE) | none | – | 2.17 / 0.84 |" in md  # Table 10's plain model


def test_the_paper_constant_is_whole():
    spec = importlib.util.spec_from_file_location("bench_results_mlm2", ROOT / "bench" / "results.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    for name, rows in mod.MLM_PAPER.items():
        assert set(rows) == set(mod.MLM_VARIANTS), name
        for cells in rows.values():
            assert len(cells) == len(mod.MLM_PAPER_LENGTHS)
            for ppl, acc in cells:
                assert ppl == ">500" or math.isfinite(float(ppl))
                assert acc == "<0.1" or 0 <= float(acc) <= 1
    assert mod.MLM_PAPER["ReRoPE"]["I.S."][-1] == ("311.24", "0.12")  # spot checks against Table 1 as printed
    assert mod.MLM_PAPER["PoSE"]["none"][4] == ("240.25", "0.10")
    assert set(mod.MLM_PAPER_ROW) <= set(positions.AVAILABLE)
