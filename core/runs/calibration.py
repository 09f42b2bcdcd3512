"""The forward passes a measured method needs: Algorithm 1's ``measure``, its L_tr references, Prop. 1/2's statistics.

:mod:`core.runs.temperature` holds the maths and the searches over a ``measure``
callable; :mod:`core.runs.methods` names the methods and resolves them; this
module builds the callables from :mod:`core.runs.engine` and
chooses the L_tr reference documents: the same task, depth and seeds at the
model's training length (for pasted text: a window of the same text around
the needle, cut to L_tr tokens).

On a decoder-only LM (``Loaded.decoder_only``) a ``measure`` reads the question's rows only
(:func:`decoder_records`): a causal row ``i`` sees ``i + 1`` keys, so the rows before ``L_tr`` of a long document
are exactly as at ``L_tr`` and a mean over every row would hide the dispersion past it; the question is the row
that must find the needle, and its rows at ``L_ex`` are compared with the same question's rows at ``L_tr`` (the
reference document ends in the same question). A document without a question (a language-modelling prefix) is
read on all its rows.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np
import torch

from core.data import tasks
from core.errors import NumericalError, UserError
from core.kinds import DECODER
from core.mechanics.probes import ProbeRecord, ProbeSpec, Recorder
from core.mechanics.run_pass import Pass
from core.models import Loaded
from core.runs import engine, temperature
from core.runs.temperature import Calibration, LayerStats
from core.values.choice import TRAINED, Choice
from core.values.schedule import Schedule

Progress = Callable[[float], None]


def reference_document(loaded: Loaded, document: tasks.Document, length: int | None = None) -> tasks.Document:
    """The document's counterpart at L_tr (or ``length``): same task, depth and seed."""
    length = length or loaded.train_length
    if document.task in tasks.GENERATED:
        haystack = document.meta.get("haystack", "default")
        try:
            return tasks.make(
                document.task, loaded.tokenizer, length, depth=document.depth, seed=document.seed, haystack=haystack
            )
        except ValueError as err:  # e.g. a task that does not fit in this model's L_tr: nothing to compare with
            raise UserError(f"No L_tr reference for this document: {err}") from None
    return _text_window(loaded, document, length)


def _text_window(loaded: Loaded, doc: tasks.Document, length: int) -> tasks.Document:
    """A window of a pasted document's context around its needle, plus the question, in ``length`` tokens."""
    tok = loaded.tokenizer
    q0 = doc.question_span[0] if doc.question_span[1] > doc.question_span[0] else len(doc.text)
    context, question = doc.text[:q0], doc.text[q0:]
    if len(tok(doc.text).input_ids) <= length:
        return doc
    a, b = doc.needle_span if doc.needle_span[1] > doc.needle_span[0] else (0, 0)
    centre = (a + b) // 2

    def window(chars: int) -> tuple[int, int]:
        lo = max(0, min(centre - chars // 2, len(context) - chars))
        return lo, min(len(context), lo + chars)

    lo_c, hi_c = max(b - a, 1), len(context)
    while lo_c < hi_c:  # the widest window that fits
        mid = (lo_c + hi_c + 1) // 2
        s, e = window(mid)
        if len(tok(context[s:e] + question).input_ids) <= length:
            lo_c = mid
        else:
            hi_c = mid - 1
    s, e = window(lo_c)
    text = context[s:e] + question
    shift = -s
    needle = (max(0, a + shift), max(0, b + shift)) if b > a else (0, 0)
    qa = len(context[s:e])
    meta = {**doc.meta, "tokens": len(tok(text).input_ids), "window": (s, e)}
    return replace(doc, text=text, needle_span=needle, question_span=(qa, qa + len(question)), meta=meta)


def measure(
    loaded: Loaded, documents: list[tasks.Document], base: Choice | None = None
) -> Callable[[object], LayerStats]:
    """tau schedule -> mean per-layer Pmax/H over ``documents`` under ``base`` with that tau (its scheme,
    targets, CosScale; None: as trained), stats-only probes, no generation, memoised; each document's own
    per-layer values ride along (``doc_pmax`` / ``doc_entropy``, in ``documents``' order: Algorithm 1's
    bootstrap band resamples them)."""
    base = TRAINED if base is None else base
    how = Pass(probes=ProbeSpec.stats_only(), generate=False)
    encoded = [engine.encode(loaded, d) for d in documents]
    cache: dict[tuple, LayerStats] = {}

    def fn(tau) -> LayerStats:
        key = Schedule.of(tau).key()
        if key not in cache:
            if loaded.decoder_only:  # the question's rows (see the module docstring)
                recs = decoder_records(loaded, encoded, base.with_(tau=tau))
            else:
                recs = [r.probes for r in engine.run_encoded(loaded, documents, encoded, base.with_(tau=tau), how)]
            doc_pmax = np.stack([np.asarray(r.layer_pmax, dtype=float) for r in recs])  # [documents, layers]
            doc_entropy = np.stack([np.asarray(r.layer_entropy, dtype=float) for r in recs])
            cache[key] = LayerStats(
                pmax=np.mean([r.layer_pmax for r in recs], axis=0),
                entropy=np.mean([r.layer_entropy for r in recs], axis=0),
                head_pmax=np.mean([r.pmax[0] for r in recs], axis=0),  # [layers, heads]
                head_entropy=np.mean([r.entropy[0] for r in recs], axis=0),
                doc_pmax=doc_pmax,
                doc_entropy=doc_entropy,
            )
        return cache[key]

    return fn


#: The probes a decoder's question-row pass records: Pmax and H per layer and head, nothing else.
_ROW_STATS = ProbeSpec(heatmap=False, sorted_logits=False, cosine_hist_bins=0, kind=DECODER)


def decoder_records(
    loaded: Loaded, encoded: list[engine.Encoded], choice: Choice, rows: list[tuple[int, int]] | None = None
) -> list[ProbeRecord]:
    """One prefill per document (no answer) of a decoder-only LM under ``choice`` (its tau, scheme and targets,
    read for the model by :func:`core.runs.engine.choice_for`), Pmax and H recorded on ``rows`` only (default:
    :attr:`core.runs.engine.Encoded.question_rows`), through the same attention call and position-scheme pass as the engine's.

    Why not :func:`core.runs.engine.run_encoded`: its recorder averages over every real row of the prompt, and a
    recorder weighing only some rows is this module's concern (the question's rows against the same rows at L_tr);
    the pass itself is the engine's (``base_model`` under :func:`core.runs.rope_pass.scheme_pass`). One document
    per pass: a padded batch would move the question's rows, and long documents run one at a time anyway."""
    from core.runs import rope_pass

    choice = engine.choice_for(loaded, choice)
    how = Pass(probes=_ROW_STATS, generate=False)
    out = []
    for i, enc in enumerate(encoded):
        a, b = rows[i] if rows is not None else enc.question_rows
        mask = torch.zeros(1, enc.n, dtype=torch.bool)
        mask[0, a:b] = True
        recorder = Recorder(_ROW_STATS, mask)
        ids = torch.as_tensor(enc.input_ids, dtype=torch.long)[None].to(loaded.device)
        engine.check_length(loaded, enc.n)
        with torch.inference_mode(), rope_pass.scheme_pass(loaded, choice, how, recorder, enc.n):
            hidden = loaded.model.base_model(input_ids=ids).last_hidden_state
        bad = recorder.nonfinite(DECODER)
        if bad or not bool(torch.isfinite(hidden).all()):
            raise NumericalError(
                f"NaN/inf appeared in the attention (layer(s) {bad}) with dtype "
                f"{str(loaded.dtype).replace('torch.', '')}: the logits divided by tau left its range, or the "
                "weights hold NaN/inf."
            )
        out.append(recorder.finish())
    return out


def siblings(document: tasks.Document, loaded: Loaded, samples: int) -> list[tasks.Document]:
    """``samples`` documents like this one (seeds seed, seed+1, ...); pasted text has only itself."""
    if samples <= 1 or document.task not in tasks.GENERATED:
        return [document]
    n = len(loaded.tokenizer(document.text).input_ids)
    haystack = document.meta.get("haystack", "default")
    return [document] + [
        tasks.make(document.task, loaded.tokenizer, n, depth=document.depth, seed=document.seed + i, haystack=haystack)
        for i in range(1, samples)
    ]


def calibrate(
    loaded: Loaded,
    document: tasks.Document,
    criterion: str = "pmax",
    fast: bool = False,
    samples: int = 1,
    base: Choice | None = None,
    progress: Progress | None = None,
    refined: bool = False,
) -> Calibration:
    """Algorithm 1 at the document's length (``samples`` documents), reference at L_tr with tau = 1
    (``refined``: the crossing itself, :func:`core.runs.temperature.refine`)."""
    meas, reference = measures(loaded, document, samples, base)
    return temperature.algorithm1(meas, reference, criterion, fast=fast, progress=progress, refined=refined)


def measures(
    loaded: Loaded, document: tasks.Document, samples: int = 1, base: Choice | None = None
) -> tuple[Callable[[object], LayerStats], LayerStats]:
    """Algorithm 1's inputs: ``measure`` over the document and its siblings, and their L_tr reference at tau = 1."""
    docs = siblings(document, loaded, samples)
    refs = [reference_document(loaded, d) for d in docs]
    return measure(loaded, docs, base), measure(loaded, refs, base)(1.0)


def both_criteria(
    meas: Callable[[object], LayerStats], reference: LayerStats, fast: bool = False, progress: Progress | None = None
) -> dict[str, Calibration]:
    """Algorithm 1 for Pmax and for entropy from one ``measure``: each pass yields both statistics,
    so with a memoised ``measure`` the second criterion costs no pass on the full grid."""
    out = {}
    for i, crit in enumerate(temperature.CRITERIA):
        sub = None if progress is None else (lambda f, i=i: progress((i + f) / len(temperature.CRITERIA)))
        out[crit] = temperature.algorithm1(meas, reference, crit, fast=fast, progress=sub)
    return out


def logit_stats(loaded: Loaded, document: tasks.Document, base: Choice | None = None) -> dict:
    """sigma (std of layer 0's average sorted logit vector) at L_ex and L_tr, and Pmax at L_tr, tau = 1 (under
    ``base``'s scheme, targets and CosScale; None: as trained). Refused in one line on a decoder-only LM, whose
    causal rows give no sorted logits over all keys (:class:`core.mechanics.probes.ProbeSpec`)."""
    if loaded.decoder_only:
        raise UserError(
            "Prop. 1 and 2 read layer 0's sorted logits over every key, which a decoder-only LM's causal rows do "
            "not give: use Algorithm 1 (pmax, entropy) on it"
        )
    spec = ProbeSpec(heatmap=False, sorted_logits=True, cosine_hist_bins=0)
    choice = (TRAINED if base is None else base).with_(tau=1.0)
    how = Pass(probes=spec, generate=False)
    ex = engine.run(loaded, document, choice, how)
    tr = engine.run(loaded, reference_document(loaded, document), choice, how)
    return logit_stats_of(ex, tr, loaded.train_length)


def length_stats_of(res: engine.Result) -> dict:
    """What the Theory page plots over length from one tau = 1 pass with sorted logits: sigma, l_max, Pmax, H."""
    return {
        "tokens": res.tokens,
        "l_max": res.probes.l_max,
        "sigma": res.probes.sigma,
        "pmax_layer0": float(res.probes.pmax[0][0].mean()),
        "pmax": res.pmax,
        "entropy": res.entropy,
    }


def logit_stats_of(ex: engine.Result, tr: engine.Result, train_length: int) -> dict:
    """The inputs of Prop. 1 and 2 from two tau = 1 runs with sorted logits: this document (``ex``) and its L_tr reference."""
    return {
        "sigma_ex": ex.probes.sigma,
        "sigma_tr": tr.probes.sigma,
        "pmax_tr": float(tr.probes.pmax[0][0].mean()),  # layer 0, the layer sigma comes from
        "l_max_ex": ex.probes.l_max,
        "l_max_tr": tr.probes.l_max,
        "length": ex.tokens,
        "train_length": train_length,
    }
