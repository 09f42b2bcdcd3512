"""The real-LLM section of docs/results.md says only what its CSVs hold (issue 57: every number in the new docs
section comes from the CSVs): each cell of its perplexity table is the CSV's mean per-token NLL ± bootstrap SE of
that method and length, each cell of its pass-key table the sweep's accuracy ± binomial SE (documents), to the
digits shown, and a cell the CSV does not hold says "not run"."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pandas as pd
import pytest

from core.experiments import perplexity, sweep

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "assets" / "results"
#: The section's row names, as the tables of core.experiments name a (scheme, method) cell.
NAMES = {
    "tau = 1": "none",
    "log-length": "log-length",
    "Algorithm 1 (Pmax)": "pmax",
    "YaRN": "yarn-rope + none",
    "YaRN + log-n": "yarn-rope + log-n-rows",  # Qwen's log-n by query position, as a causal decoder applies it
    "dynamic NTK": "dynamic-ntk + none",
    "Llama 4 tuning": "llama4",  # a tau per query row past L_tr, on the model's own frequencies
}
NOT_RUN = "not run"


def _section() -> str:
    text = (ROOT / "docs" / "results.md").read_text()
    start = text.index("## On a real LLM: SmolLM2-135M")
    end = text.find("\n## ", start + 1)
    return text[start : end if end > 0 else None]


def _tables(section: str) -> list[tuple[list[int], list[list[str]]]]:
    """Each Markdown table of the section whose first column is ``method``: its token counts and its rows."""
    out, lines = [], section.splitlines()
    for i, line in enumerate(lines):
        if not line.startswith("| method |"):
            continue
        lengths = [int(re.sub(r"\D", "", c.split("tokens")[0])) for c in line.strip().strip("|").split("|")[1:]]
        rows = []
        for row in lines[i + 2 :]:
            if not row.startswith("| "):
                break
            rows.append([c.strip() for c in row.strip().strip("|").split("|")])
        out.append((lengths, rows))
    return out


def _check(table: pd.DataFrame, lengths: list[int], rows: list[list[str]]) -> int:
    seen = 0
    for cells in rows:
        label = NAMES[cells[0]]
        for tokens, cell in zip(lengths, cells[1:]):
            held = table.loc[label, tokens] if label in table.index and tokens in table.columns else None
            if cell == NOT_RUN:
                assert held is None or held != held, (label, tokens, "the CSV holds it", held)
            else:
                assert cell == held, (label, tokens, cell, held)
                seen += 1
    return seen


def test_the_sections_tables_are_the_csvs():
    tables = _tables(_section())
    assert len(tables) == 2, "the section has its perplexity and pass-key tables"
    ppl = perplexity.nll_table(pd.read_csv(RESULTS / "smollm2-perplexity.csv", keep_default_na=False))
    key = sweep.accuracy_se_table(pd.read_csv(RESULTS / "smollm2-passkey.csv", keep_default_na=False))
    assert _check(ppl, *tables[0]) >= 6 and _check(key, *tables[1]) >= 5  # cells the CSVs hold, checked


#: The README's real-model rows: which table and which cell each is.
README_ROWS = {
    "NLL, tau = 1": ("perplexity", "none"),
    "NLL, log-length": ("perplexity", "log-length"),
    "NLL, Algorithm 1 (Pmax)": ("perplexity", "pmax"),
    "NLL, YaRN": ("perplexity", "yarn-rope + none"),
    "pass key, tau = 1": ("passkey", "none"),
    "pass key, YaRN": ("passkey", "yarn-rope + none"),
    "pass key, Algorithm 1 (Pmax)": ("passkey", "pmax"),
}


def test_the_readmes_real_model_rows_are_the_csvs():
    text = (ROOT / "README.md").read_text()
    lines = text[text.index("| SmolLM2-135M |") :].splitlines()
    lengths = [int(re.sub(r"\D", "", c.split("tokens")[0])) for c in lines[0].strip().strip("|").split("|")[1:]]
    tables = {
        "perplexity": perplexity.nll_table(pd.read_csv(RESULTS / "smollm2-perplexity.csv", keep_default_na=False)),
        "passkey": sweep.accuracy_se_table(pd.read_csv(RESULTS / "smollm2-passkey.csv", keep_default_na=False)),
    }
    rows = [[c.strip() for c in r.strip().strip("|").split("|")] for r in lines[2:] if r.startswith("| ")]
    rows = rows[: next((i for i, r in enumerate(rows) if r[0] not in README_ROWS), len(rows))]
    assert {r[0] for r in rows} == set(README_ROWS)
    h = pd.read_csv(RESULTS / "smollm2-dispersion.csv").query("method == 'none'")
    h = h.pivot(index="layer", columns="tokens", values="entropy")
    assert f"entropy grows {(h[16384] - h[8192]).mean():.2f} nats from 1x to 2x" in " ".join(text.split())
    for r in rows:
        which, label = README_ROWS[r[0]]
        t = tables[which]
        one = t.loc[[label]].rename(index={label: "none"}) if label in t.index else t.iloc[:0]
        _check(one, lengths, [["tau = 1", *r[1:]]])  # the one row, under the name _check reads


def test_the_position_figures_are_the_csvs():
    """The NLL by position the text quotes: tau = 1's buckets at 1x, and at 2x once its row exists."""
    df = pd.read_csv(RESULTS / "smollm2-perplexity.csv", keep_default_na=False)
    section = _section()
    plain = df[(df["method"] == "none") & (df["scheme"] == "none")].set_index("tokens")
    for tokens, buckets in ((8192, ("0-0.5x", "0.5-1x")), (16384, ("0-0.5x", "0.5-1x", "1-2x"))):
        if tokens in plain.index:
            for b in buckets:
                assert f"{float(plain.loc[tokens, 'nll_' + b]):.3f}" in section, (tokens, b)


@pytest.mark.parametrize("bad", ["3.999 ± 0.001", NOT_RUN])
def test_a_wrong_cell_is_caught(bad):
    ppl = perplexity.nll_table(pd.read_csv(RESULTS / "smollm2-perplexity.csv", keep_default_na=False))
    with pytest.raises(AssertionError):
        _check(ppl, [8192], [["tau = 1", bad]])


def test_the_rerun_figures_are_the_csvs():
    """The re-run paragraph: each cell's NLL ± SE on the other sequences and on the first ones, and how many SE of
    their difference apart they are, to the digits shown."""
    first = pd.read_csv(RESULTS / "smollm2-perplexity.csv", keep_default_na=False)
    again = pd.read_csv(RESULTS / "smollm2-perplexity-rerun.csv", keep_default_na=False)
    section = " ".join(_section().split())  # the prose wraps anywhere
    for r in again.itertuples():
        o = first[(first["tokens"] == r.tokens) & (first["method"] == r.method) & (first["scheme"] == "none")].iloc[0]
        apart = abs(r.nll_per_token - o["nll_per_token"]) / (r.nll_se**2 + o["nll_se"] ** 2) ** 0.5
        said = f"{r.nll_per_token:.3f} ± {r.nll_se:.3f} against {o['nll_per_token']:.3f} ± {o['nll_se']:.3f}"
        assert said in section, said
        assert f"{apart:.1f} SE" in section, apart


def test_the_dispersion_figures_are_the_csvs():
    """The dispersion table (the mean over layers of the question rows' Pmax and H at each length, tau = 1) and the
    growth of H the text quotes (the layers' mean, and in how many layers), from bench/dispersion.py's CSV."""
    d = pd.read_csv(RESULTS / "smollm2-dispersion.csv")
    d = d[d["method"] == "none"]
    section = " ".join(_section().split())
    mean = d.groupby("tokens")[["pmax", "entropy"]].mean()
    for tokens, r in mean.iterrows():
        assert f"| {tokens:,} (" in section and f"| {r['pmax']:.3f} | {r['entropy']:.3f} |" in section, tokens
    h = d.pivot(index="layer", columns="tokens", values="entropy")
    for a, b in ((4096, 8192), (8192, 16384)):
        grow = h[b] - h[a]
        assert f"H grows by {grow.mean():.2f} nats on the layers' mean" in section, (a, b)
        assert f"{int((grow > 0).sum())} of {len(grow)} layers" in section, (a, b)


def test_the_dispersion_under_a_methods_tau_is_the_csvs():
    """The text's figures for the question's rows at 2x under log-length's tau: its tau, the layers' mean Pmax and
    H, how far below tau = 1's H it is and in how many layers, from the dispersion CSV's log-length rows."""
    d = pd.read_csv(RESULTS / "smollm2-dispersion.csv")
    got = d[(d["method"] == "log-length") & (d["tokens"] == 16384)]
    if got.empty:
        return
    plain = d[(d["method"] == "none") & (d["tokens"] == 16384)].set_index("layer")["entropy"]
    drop = plain - got.set_index("layer")["entropy"]
    section = " ".join(_section().split())
    said = (
        f"({got['tau'].iloc[0]:.3f}; `--multiples 2 --methods log-length`, the same 2 documents) the question's rows "
        f"sharpen in every layer but come back only a little: Pmax {got['pmax'].mean():.3f} and H "
        f"{got['entropy'].mean():.3f} nats on the layers' mean, H lower than tau = 1's by {drop.mean():.2f} nats, in "
        f"{int((drop > 0).sum())} of {len(drop)} layers"
    )
    assert said in section, said


def test_the_pass_key_rows_attention_figures_are_the_csvs():
    """The question rows' Pmax and H the pass-key paragraph quotes (the mean over a cell's documents): tau = 1 at 1x
    and 2x, YaRN and YaRN + log-n at 2x, each pair to the digits shown."""
    d = pd.read_csv(RESULTS / "smollm2-passkey.csv", keep_default_na=False)
    section = " ".join(_section().split())
    for tokens, scheme, method in (
        (8192, "none", "none"),
        (16384, "none", "none"),
        (16384, "yarn-rope", "none"),
        (16384, "yarn-rope", "log-n-rows"),
        (16384, "none", "pmax"),
    ):
        cell = d[(d["tokens"] == tokens) & (d["scheme"] == scheme) & (d["method"] == method)]
        if cell.empty:
            continue
        pmax, h = cell["pmax"].astype(float).mean(), cell["entropy"].astype(float).mean()
        assert f"{pmax:.3f}" in section and f"{h:.3f}" in section, (tokens, scheme, method, pmax, h)


#: The header of the section's table of every method's question rows at 2x (from the pass-key CSV).
BY_METHOD = "| method, at 16,384 tokens (2x) | tau | Pmax | H (nats) |"


def test_the_dispersion_by_method_is_the_pass_key_csv():
    """The dispersion of the question's rows under each of the six methods at 2x: the mean over a cell's documents
    of the pass-key rows' tau, Pmax and H (each the mean over layers), to the digits shown; "not run" where the CSV
    holds no such cell."""
    d = pd.read_csv(RESULTS / "smollm2-passkey.csv", keep_default_na=False)
    d["cell"] = d["scheme"] + " + " + d["method"]
    lines = _section().splitlines()
    start = lines.index(BY_METHOD)
    table = itertools.takewhile(lambda r: r.startswith("| "), lines[start + 2 :])
    rows = [[c.strip() for c in r.strip().strip("|").split("|")] for r in table]
    assert [r[0] for r in rows] == list(NAMES)
    for name, *cells in rows:
        label = NAMES[name]
        cell = d[(d["tokens"] == 16384) & (d["cell"] == (label if " + " in label else "none + " + label))]
        if cells[0] == NOT_RUN:
            assert cell.empty, (name, "the CSV holds it")
            continue
        want = [f"{cell[c].astype(float).mean():.3f}" for c in ("tau", "pmax", "entropy")]
        assert cells[:3] == want, (name, cells, want)


def test_a_temperatures_figures_at_2x_are_the_csvs():
    """The temperatures' paragraph at 2x: log-length's and Algorithm 1's NLL by position bucket ("a / b before L_tr,
    c past it"), Algorithm 1's tau and how far its NLL is from tau = 1's, to the digits shown."""
    df = pd.read_csv(RESULTS / "smollm2-perplexity.csv", keep_default_na=False)
    section = " ".join(_section().split())
    at2 = df[(df["tokens"] == 16384) & (df["scheme"] == "none")].set_index("method")
    for m in ("log-length", "pmax", "llama4"):
        if m not in at2.index:
            continue
        r = at2.loc[m]
        said = f"{float(r['nll_0-0.5x']):.3f} / {float(r['nll_0.5-1x']):.3f} before L_tr, {float(r['nll_1-2x']):.3f}"
        assert said in section, (m, said)
    half = df[(df["tokens"] == 4096) & (df["method"] == "pmax")]
    if not half.empty:
        assert f"gap {float(half['gap'].iloc[0]):.3f}, where tau does not go past 1" in section
    if "llama4" in at2.index:
        assert f"tau {float(at2.loc['llama4', 'tau']):.3f} on the rows' mean" in section
    if "pmax" in at2.index:
        r = at2.loc["pmax"]
        assert f"it is **{float(r['tau']):.2f}**" in section
        worse = float(r["nll_per_token"]) - float(at2.loc["none", "nll_per_token"])
        assert f"{worse:.3f} nats worse than tau = 1" in section
        assert r["reached"] == "True" and f"within {abs(float(r['gap'])):.4f}" in section


def test_algorithm_1s_pass_key_calibration_is_the_csvs():
    """The pass-key paragraph's Algorithm 1 at 2x: the tau its calibration picked and the gap it left (one per
    length, the same on every row), and whether it reached the 1x level, to the digits shown."""
    d = pd.read_csv(RESULTS / "smollm2-passkey.csv", keep_default_na=False)
    cell = d[(d["tokens"] == 16384) & (d["scheme"] == "none") & (d["method"] == "pmax")]
    if cell.empty:
        return
    assert cell["tau"].nunique() == 1 and cell["gap"].nunique() == 1
    r = cell.iloc[0]
    section = " ".join(_section().split())
    assert f"tau = **{float(r['tau']):.2f}**" in section
    assert f"gap {float(r['gap']):.3f}, `reached` {r['reached']}" in section


def test_the_per_layer_figures_are_the_dispersion_csv():
    """bench/dispersion_figure.py's figures (the PNGs docs/results.md shows): per layer, the bars are log-length's
    rows at 2x, the reference tau = 1's at 1x and the baseline tau = 1's at 2x, for Pmax and H alike."""
    from tests.conftest import bench_module

    d = pd.read_csv(RESULTS / "smollm2-dispersion.csv")
    figs = bench_module("dispersion_figure").figures(d, "log-length", 16384)

    def rows(method: str, tokens: int, stat: str) -> list[float]:
        return d[(d["method"] == method) & (d["tokens"] == tokens)].sort_values("layer")[stat].tolist()

    for stat, fig in figs.items():
        bars, ref, base = fig.data
        assert list(bars.y) == pytest.approx(rows("log-length", 16384, stat))
        assert list(ref.y) == pytest.approx(rows("none", 8192, stat))
        assert list(base.y) == pytest.approx(rows("none", 16384, stat))
        assert (RESULTS / f"smollm2-dispersion-{stat}.png").stat().st_size > 10_000
    assert "smollm2-dispersion-entropy.png" in _section() and "smollm2-dispersion-pmax.png" in _section()
