"""How fast the Explore page answers a tau change: first visit of a tau vs a revisit (cached).

    python bench/app_latency.py [--model NAME|FOLDER] [--multiple 8] [--taus 0.9,0.8,0.7] [--no-apptest]

Measures, in one run, on this machine (CPU unless a GPU is present):

1. the backend path: the same cached functions ``app_pages/explore.py`` calls
   (``ui.cache.run`` for the chosen tau, the tau = 1 run and the L_tr
   reference, ``ui.cache.bias_curves``) plus every Explore figure built by
   ``core.views.plots``; the page's tau = 1 run and the reference are warmed first,
   as they are when a person moves the slider;
2. the whole page through Streamlit's AppTest: the script rerun after the
   slider moves, figures serialised (what the browser waits for, minus the
   network and the drawing).

Aims (issue 4): first visit < 1 s, revisit < 0.1 s, for the default model at
8 x L_tr. The default model is AAE_MODEL when set, else the bundled default.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

from core.mechanics.run_pass import Pass
from core.models import default_model
from core.runs import methods
from core.runs.settings import DocumentRequest
from core.values.choice import Choice
from core.views import plots

ROOT = Path(__file__).resolve().parents[1]


def figures(loaded, doc, chosen, base, ref, curves) -> int:
    """Build every figure the Explore page draws (and the text view); returns how many."""
    figs = [
        plots.layer_meters(chosen.probes.layer_pmax, ref.probes.layer_pmax, "Pmax", base.probes.layer_pmax),
        plots.layer_meters(
            chosen.probes.layer_entropy, ref.probes.layer_entropy, "entropy H", base.probes.layer_entropy
        ),
        plots.heatmap(
            chosen.probes.heatmap_mean, chosen.probes.heatmap_edges, chosen.needle_tokens, chosen.question_tokens
        ),
        plots.heatmap(base.probes.heatmap_mean, base.probes.heatmap_edges, base.needle_tokens, base.question_tokens),
        plots.question_profile(chosen.probes.profile, chosen.needle_tokens, chosen.question_tokens),
        plots.question_profile(base.probes.profile, base.needle_tokens, base.question_tokens),
        plots.rpe_curves(curves, list(range(min(8, curves.shape[0]))), chosen.question_tokens[0], loaded.train_length),
    ]
    for f in figs:
        f.to_plotly_json()  # what Streamlit serialises
    plots.token_shading_html(
        doc.text, chosen.offsets, chosen.probes.profile.mean(0), chosen.needle_tokens, 150, chosen.needle_tokens
    )
    return len(figs)


def backend(model: str, multiple: int, taus: list[float]) -> dict:
    from ui import cache  # imported here: Streamlit prints a bare-mode warning once

    loaded = cache.model(model)
    lt = loaded.train_length
    req = DocumentRequest(task="passkey", tokens=multiple * lt, depth=0.5, seed=0)
    probes = cache.explore_probes(loaded.n_layers - 1, None)  # the page's default: last layer, head mean
    t = time.perf_counter()
    doc = cache.document(loaded, req)
    n = cache.token_count(loaded, req)
    base = cache.run(loaded, req, Choice.of(tau=1.0, method=methods.AS_TRAINED), Pass(probes=probes))
    cache.run_reference(loaded, req)  # warms what the page draws: the reference run and the bias curves
    q0 = base.question_tokens[0]
    cache.bias_curves(loaded, q0, base.tokens)
    warm = time.perf_counter() - t

    def visit(tau: float) -> float:
        t0 = time.perf_counter()
        chosen = cache.run(loaded, req, Choice.of(tau=tau, method=methods.FIXED), Pass(probes=probes))
        b = cache.run(loaded, req, Choice.of(tau=1.0, method=methods.AS_TRAINED), Pass(probes=probes))
        r = cache.run_reference(loaded, req)
        c = cache.bias_curves(loaded, q0, chosen.tokens)
        figures(loaded, doc, chosen, b, r, c)
        return time.perf_counter() - t0

    first = [visit(t) for t in taus]
    again = [visit(t) for t in taus]
    return {
        "loaded": loaded,
        "tokens": n,
        "warm": warm,
        "first": first,
        "again": again,
        "encoder": [
            cache.run(loaded, req, Choice.of(tau=t, method=methods.FIXED), Pass(probes=probes)).seconds["encode"]
            for t in taus
        ],
    }


def apptest(model: str, multiple: int, taus: list[float]) -> dict:
    from streamlit.testing.v1 import AppTest

    os.environ["AAE_MODEL"] = model
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=600)
    at.run()
    from ui import cache

    lt = cache.model(model).train_length
    at.session_state["doc_tokens"] = multiple * lt
    t = time.perf_counter()
    at.run()
    warm = time.perf_counter() - t
    if at.exception or at.error:
        raise SystemExit(f"the app failed: {[e.value for e in at.exception] or [e.value for e in at.error]}")

    def move(tau: float) -> float:
        t0 = time.perf_counter()
        at.sidebar.slider(key="tau_value").set_value(tau).run()
        return time.perf_counter() - t0

    first = [move(t) for t in taus]
    again = [move(t) for t in taus]
    return {"warm": warm, "first": first, "again": again}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=os.environ.get("AAE_MODEL") or default_model())
    p.add_argument("--multiple", type=int, default=8, help="document length in multiples of L_tr (default 8)")
    p.add_argument("--taus", default="0.9,0.8,0.7")
    p.add_argument("--no-apptest", action="store_true", help="skip the whole-page AppTest measurement")
    a = p.parse_args()
    if not a.model:
        print("No model: no bundled model in assets/models and AAE_MODEL unset; pass --model FOLDER", file=sys.stderr)
        return 2
    taus = [float(x) for x in a.taus.split(",")]
    b = backend(a.model, a.multiple, taus)
    d = b["loaded"].describe()
    med = statistics.median
    print(
        f"model {d['name']}: L_tr {d['train_length']}, {d['parameters'] / 1e6:.1f} M parameters, {d['device']}/{d['dtype']}, "
        f"{d['layers']} layers x {d['heads']} heads"
    )
    print(
        f"document: passkey at {a.multiple} x L_tr = {b['tokens']:,} tokens; warm-up (document, tau=1 run, "
        f"L_tr reference) {b['warm']:.2f} s"
    )
    print("backend (the page's cached functions + every Explore figure):")
    print(
        f"  tau change, first visit: median {med(b['first']):.3f} s  (runs {', '.join(f'{x:.3f}' for x in b['first'])}; "
        f"encoder pass {med(b['encoder']):.3f} s)  aim < 1 s"
    )
    print(f"  tau change, revisit:     median {med(b['again']):.4f} s  aim < 0.1 s")
    print(f"  first / revisit ratio:   {med(b['first']) / max(med(b['again']), 1e-9):.0f} x")
    if not a.no_apptest:
        other = [round(x - 0.05, 2) for x in taus]  # taus the backend part has not cached yet
        t = apptest(a.model, a.multiple, other)
        print(f"whole page (AppTest rerun after the slider moves to {', '.join(map(str, other))}, figures serialised):")
        print(
            f"  first load at {a.multiple} x L_tr: {t['warm']:.2f} s (document and tau = 1 run cached by the part above)"
        )
        print(
            f"  tau change, first visit: median {med(t['first']):.3f} s  (runs {', '.join(f'{x:.3f}' for x in t['first'])})"
        )
        print(f"  tau change, revisit:     median {med(t['again']):.3f} s")
        print(f"  first / revisit ratio:   {med(t['first']) / max(med(t['again']), 1e-9):.0f} x")
    ok = med(b["first"]) < 1.0 and med(b["again"]) < 0.1
    print(f"aims met (backend): {'yes' if ok else 'no'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
