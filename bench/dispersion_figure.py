"""The dispersion table's per-layer picture (issue 57, item 1), drawn as the app draws its meters:

    python bench/dispersion_figure.py [--csv assets/results/smollm2-dispersion.csv] [--method log-length]
                                      [--tokens 16384] [--out assets/results/smollm2-dispersion]

For Pmax and for H of the question's rows, one figure each (``<out>-pmax.png``, ``<out>-entropy.png``): per layer,
the bars are ``--method`` at ``--tokens`` tokens, the black ticks tau = 1 at L_tr (the reference Algorithm 1
matches), the grey circles tau = 1 at ``--tokens``: :func:`core.views.plots.layer_meters`, the Explore page's own
figure, on bench/dispersion.py's CSV. Why a bench script: the PNGs are drawn by Debian's chromium through
Playwright (plotly's own image export needs kaleido, which this project does not install), so it runs where a
browser is, once the CSV changes; what is drawn is :func:`figures`, which the tests check against the CSV.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # core, also without an installed package

import pandas as pd  # noqa: E402

from core.runs import methods  # noqa: E402
from core.views import plots  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
STATS = {"pmax": "Pmax", "entropy": "H (nats)"}


def figures(df: pd.DataFrame, method: str, tokens: int) -> dict:
    """``{"pmax": Figure, "entropy": Figure}``: per layer, ``method`` at ``tokens`` (bars), tau = 1 at L_tr (the
    reference) and tau = 1 at ``tokens`` (the baseline), from a bench/dispersion.py CSV."""
    train = int(df["train_length"].iloc[0])

    def per_layer(m: str, n: int, stat: str) -> pd.Series:
        cell = df[(df["method"] == m) & (df["tokens"] == n)].sort_values("layer")
        if cell.empty:
            raise SystemExit(f"the CSV has no rows of method {m} at {n:,} tokens")
        return cell.set_index("layer")[stat]

    out = {}
    for stat, name in STATS.items():
        chosen, ref, base = (
            per_layer(method, tokens, stat),
            per_layer(methods.AS_TRAINED, train, stat),
            per_layer(methods.AS_TRAINED, tokens, stat),
        )
        tau = float(df[(df["method"] == method) & (df["tokens"] == tokens)]["tau"].iloc[0])
        fig = plots.layer_meters(
            chosen.to_numpy(),
            ref.to_numpy(),
            name=name,
            baseline=base.to_numpy(),
            title=f"{name} of the question's rows at {tokens:,} tokens: {method} (tau {tau:.3f}) against tau = 1",
        )
        fig.update_xaxes(title="layer")
        out[stat] = fig
    return out


def render(figs: dict, stem: str, width: int = 1100, height: int = 520) -> list[Path]:
    """Each figure as ``<stem>-<stat>.png``, through Debian's chromium (Playwright); the plotly.js is inlined."""
    from playwright.sync_api import sync_playwright

    paths = []
    with tempfile.TemporaryDirectory() as tmp, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--headless", "--no-sandbox", "--disable-gpu"])
        page = browser.new_page(viewport={"width": width, "height": height})
        for stat, fig in figs.items():
            html = Path(tmp) / f"{stat}.html"
            fig.update_layout(width=width, height=height)
            fig.write_html(html, include_plotlyjs=True, full_html=True)
            page.goto(html.as_uri())
            page.wait_for_selector(".main-svg")
            path = Path(f"{stem}-{stat}.png")
            page.screenshot(path=str(path), full_page=False)
            paths.append(path)
        browser.close()
    return paths


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--csv", default=str(ROOT / "assets/results/smollm2-dispersion.csv"))
    p.add_argument("--method", default=methods.BASELINE, help="the method whose rows are the bars")
    p.add_argument("--tokens", type=int, default=16384, help="the length of those rows")
    p.add_argument("--out", default=str(ROOT / "assets/results/smollm2-dispersion"), help="PNG path stem")
    args = p.parse_args(argv)
    if not Path(CHROMIUM).exists():
        print(f"{CHROMIUM} is missing: apt-get install -y chromium (Debian)", file=sys.stderr)
        return 2
    for path in render(figures(pd.read_csv(args.csv), args.method, args.tokens), args.out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
