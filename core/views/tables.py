"""The data behind each Explore view as a table (the CSV a person downloads), built from plain results.

Kept out of the pages so a page only arranges widgets, and so the same
tables can be produced from a notebook or a script from a
:class:`core.runs.engine.Result`.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from core.kinds import CROSS
from core.runs.engine import Result
from core.values.schedule import Schedule


def meters_table(chosen: Result, base: Result, ref: Result) -> pd.DataFrame:
    """Per-layer mean Pmax and H: the chosen tau, tau = 1 on this document, and the L_tr reference."""
    return pd.DataFrame(
        {
            "layer": range(len(chosen.probes.layer_pmax)),
            "pmax": chosen.probes.layer_pmax,
            "pmax_tau1": base.probes.layer_pmax,
            "pmax_ref_Ltr": ref.probes.layer_pmax,
            "entropy": chosen.probes.layer_entropy,
            "entropy_tau1": base.probes.layer_entropy,
            "entropy_ref_Ltr": ref.probes.layer_entropy,
        }
    )


def heatmap_table(res: Result, pool: str = "mean") -> pd.DataFrame:
    """The pooled map, rows and columns named by the token index where each bin starts."""
    z = res.probes.heatmap_mean if pool == "mean" else res.probes.heatmap_max
    pos = res.probes.heatmap_edges[:-1]
    return pd.DataFrame(z, index=pd.Index(pos, name="query_token"), columns=[f"key_{p}" for p in pos])


def profile_table(chosen: Result, base: Result) -> pd.DataFrame:
    """Question -> position attention per layer, at the chosen tau and at tau = 1."""
    d: dict[str, np.ndarray] = {"token": np.arange(chosen.probes.profile.shape[1])}
    for l in range(chosen.probes.profile.shape[0]):
        d[f"layer_{l}"] = chosen.probes.profile[l]
        d[f"layer_{l}_tau1"] = base.probes.profile[l]
    return pd.DataFrame(d)


def _layer_or_mean(values: dict[int, np.ndarray], layer: int | None) -> np.ndarray:
    return values[layer] if layer is not None else np.mean(list(values.values()), axis=0)


def answer_attention(res: Result, layer: int | None = None) -> tuple[np.ndarray, list[str]] | None:
    """The answer's attention over the document, ``[answer tokens, document bins]``, and the tokens it wrote:
    one decoder layer's cross-attention map or the mean over layers (None); None when the run has none."""
    maps = res.probes.layers(CROSS, "map") if res.probes is not None else {}
    if not maps or not res.answer_tokens:
        return None
    z = _layer_or_mean(maps, layer)
    n = min(len(res.answer_tokens), z.shape[0])  # a batch's item 0 may have stopped before the others
    return z[:n], list(res.answer_tokens[:n])


def needle_share(res: Result, layer: int | None = None) -> float | None:
    """The share of the answer's attention (mean over its tokens and all heads) on the needle's tokens."""
    profiles = res.probes.layers(CROSS, "profile") if res.probes is not None else {}
    if not profiles or res.needle_tokens is None:
        return None
    a, b = res.needle_tokens
    return float(_layer_or_mean(profiles, layer)[a:b].sum())


def answer_attention_table(res: Result, layer: int | None = None) -> pd.DataFrame:
    """The answer's attention map: a row per answer token, columns named by the token where each bin starts."""
    z, tokens = answer_attention(res, layer)
    rows = pd.Index([f"{i}: {t}" for i, t in enumerate(tokens)], name="answer_token")
    return pd.DataFrame(z, index=rows, columns=[f"key_{p}" for p in res.probes.heatmap_edges[:-1]])


def rpe_table(curves: np.ndarray) -> pd.DataFrame:
    """Bias b(m, n) per head (columns) over key positions n (rows)."""
    return pd.DataFrame(curves.T, columns=[f"head_{h}" for h in range(curves.shape[0])]).rename_axis("key_position")


def calibration_table(cals: dict) -> pd.DataFrame:
    """Algorithm 1's curves per criterion over the grid, with the L_tr reference beside each (Calibrate's CSV)."""
    first = next(iter(cals.values()))
    d = {"tau": list(first.grid)}
    for crit, cal in cals.items():
        d[f"S_ex_{crit}"] = cal.curve
        d[f"S_tr_{crit}"] = [cal.reference] * len(cal.grid)
    return pd.DataFrame(d)


def schedule_text(tau, rows: int | None = None) -> str:
    """A schedule in one table cell: a number (4 decimals), a per-layer list, a per-head matrix's range and
    mean, or a row schedule's mean over ``rows`` query rows (Llama 4)."""
    return Schedule.of(tau).describe(rows)


def sorted_logits_table(vectors: dict) -> pd.DataFrame:
    """Average sorted logit vectors (one column per document), by rank: the QQ plot's data."""
    return pd.DataFrame({k: pd.Series(v) for k, v in vectors.items()}).rename_axis("rank")


def tau_curves_table(curves: dict) -> pd.DataFrame:
    """tau over length, one row per (method, tokens): the formulas' curves and Algorithm 1's dots."""
    frames = [pd.DataFrame({"method": name, "tokens": xs, "tau": ys}) for name, (xs, ys) in curves.items()]
    return pd.concat(frames, ignore_index=True)
