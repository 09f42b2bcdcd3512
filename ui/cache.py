"""The app's cached backend: models, documents, encodings, runs and calibrations.

Two layers:

* the model: ``st.cache_resource`` around :func:`core.models.load` (one copy
  per process, shared by every session; :mod:`core.models` caches too);
* everything computed from it: the bounded LRU stores of :mod:`ui.stores`,
  shared by all sessions. Keys are explicit tuples of what changes a result
  (model, document request, the run's :class:`~core.values.choice.Choice` but its
  method label, probe spec), so moving tau re-runs only the forward pass (the document and
  its tokenisation are cached separately), and returning to an earlier tau is
  a dictionary lookup. Values are shared between sessions: treat them as
  read-only.

Passes a person waits for go through :mod:`ui.pass_gate` (one pass at a time
in the process; a background grid pass under way pauses at its next layer for
them). The functions here work without a Streamlit runtime too
(``bench/app_latency.py`` calls them directly). The background grid
(:mod:`ui.prefetch`) builds on this module; this module never calls it.

User-fixable errors (:class:`core.errors.UserError`) are never cached: they
propagate to the page, which shows them with ``st.error``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Hashable
from dataclasses import replace
from typing import Any

import numpy as np
import streamlit as st

from core.data import tasks
from core.errors import UserError
from core.experiments import mlm
from core.mechanics.attention import ROPE
from core.mechanics.probes import ProbeSpec
from core.mechanics.run_pass import DEFAULT_PASS, Pass
from core.models import Loaded, load
from core.runs import calibration, engine, methods, temperature, timing
from core.runs.settings import DocumentRequest
from core.values import positions
from core.values.choice import TRAINED, Choice
from core.values.schedule import ONE, Schedule
from core.views import rope_view, rpe
from ui.pass_gate import gate
from ui.stores import MISSING, stores

Progress = Callable[[float], None] | None


def attention_key(choice: Choice) -> tuple:
    """What of a :class:`~core.values.choice.Choice` changes a pass's numbers, as a key: the tau schedule, targets, CosScale
    and position scheme (not the method's name: a fixed 0.5 and a method that resolved to 0.5 are one pass)."""
    return (choice.tau.key(), choice.targets, choice.cosine_scale, choice.scheme)


# -- models -------------------------------------------------------------------------


@st.cache_resource(show_spinner="Loading the model…", max_entries=4)
def model(ref: str, device: str | None = None, train_length: int | None = None) -> Loaded:
    """A loaded model by registry name, hub id or folder (raises ModelLoadError, never cached)."""
    return load(ref, device=device, train_length=train_length)


def mkey(loaded: Loaded) -> tuple:
    return (loaded.spec.source, loaded.train_length, str(loaded.device), str(loaded.dtype))


# -- documents ----------------------------------------------------------------------


def document(loaded: Loaded, req: DocumentRequest):
    """The document a request builds (raises UserError for empty text, bad depth, too few tokens)."""
    return stores()["doc"].get(
        (mkey(loaded), req), lambda: req.build_for(loaded)
    )  # checked against memory before it is built


def reference_document(loaded: Loaded, req: DocumentRequest):
    """The request's counterpart at L_tr: same task, depth and seed (pasted text: a window around the needle)."""
    doc = document(loaded, req)
    return stores()["doc"].get((mkey(loaded), "ref", req), lambda: calibration.reference_document(loaded, doc))


def token_count(loaded: Loaded, req: DocumentRequest) -> int:
    doc = document(loaded, req)
    n = doc.meta.get("tokens")
    return int(n) if n is not None else len(loaded.tokenizer(doc.text).input_ids)


def pass_estimate(loaded: Loaded, req: DocumentRequest) -> float | None:
    """Seconds one pass over the request's document should take here, for "about N s" before a long document's first
    passes. Longer than the law's own samples, far past every pass this model has made (more than 4x the longest),
    and with no fitted law yet, it first
    measures one (:func:`core.runs.engine.estimate_pass`: two short passes and one attention call, a few seconds):
    without it a move from 1x to 32x squared a 256-token pass's time, and said "about 2 min" for 68 s (issue 59)."""
    key = timing.model_key(loaded)
    n = token_count(loaded, req)
    if n > engine.SAMPLE_TOKENS and timing.law(key) is None and n > 4 * max(timing.measured(key), default=0):
        doc = document(loaded, req)
        with gate().foreground():
            engine.estimate_pass(loaded, doc, encoded(loaded, req, doc))
    return timing.estimate(key, n)


def encoded(loaded: Loaded, doc_key: Hashable, doc) -> engine.Encoded:
    """The document's tokens as every pass reads them. A masked-LM model (``loaded.seq2seq`` False) reads them
    with the masked positions of :func:`masked` replaced by its mask token, so every view (meters, maps, Algorithm
    1, Theory) shows the attention of the very input whose masked tokens the cards score; the offsets stay the
    text's own."""

    def work() -> engine.Encoded:
        enc = engine.encode(loaded, doc)
        if loaded.family != ROPE:  # T5 and a decoder-only LM read the text as it is
            return enc
        return replace(enc, input_ids=masked(loaded, doc_key, doc).ids)

    return stores()["enc"].get((mkey(loaded), doc_key), work)


def masked(loaded: Loaded, doc_key: Hashable, doc) -> mlm.MaskedSequence:
    """The document's ids with :data:`core.experiments.mlm.MASK_RATE` of its tokens masked, positions drawn by the document's
    seed (:func:`core.experiments.mlm.mask_tokens`: the masking ``python -m core mlm`` scores for the same text and seed)."""

    def work() -> mlm.MaskedSequence:
        return mlm.mask_tokens(loaded.tokenizer, engine.encode(loaded, doc).input_ids, doc.seed)

    return stores()["enc"].get((mkey(loaded), "masked", doc_key), work)


def mlm_card(loaded: Loaded, req: DocumentRequest, choice: Choice, reference: bool = False) -> dict:
    """The masked tokens' card of the request's document (its L_tr reference with ``reference``) under
    ``choice``'s tau, targets, CosScale and scheme: :func:`core.views.rope_view.card` of
    :func:`core.views.rope_view.masked_predictions` (one pass without probes, torch's fused kernel)."""
    doc_key = ("ref", req) if reference else req
    key = (mkey(loaded), "mlm-card", doc_key, attention_key(choice))

    def work() -> dict:
        doc = reference_document(loaded, req) if reference else document(loaded, req)
        seq = masked(loaded, doc_key, doc)
        with gate().foreground():
            pred = rope_view.masked_predictions(loaded, seq, choice)
            return rope_view.card(pred, loaded.tokenizer)

    return stores()["run"].get(key, work)


def distance_curves(
    loaded: Loaded,
    req: DocumentRequest,
    layer: int,
    cosine_scale: float | None = None,
    scheme: positions.Scheme = positions.PLAIN_SCHEME,
):
    """:func:`core.views.rope_view.distance_curves` of one layer on the request's (masked) document under a position
    scheme (a frequency scheme changes the curve; see that function for the others)."""

    def work():
        doc = document(loaded, req)
        with gate().foreground():
            return rope_view.distance_curves(loaded, encoded(loaded, req, doc).input_ids, layer, cosine_scale, scheme)

    return stores()["rpe"].get((mkey(loaded), "distance", req, int(layer), cosine_scale, scheme), work)


def scheme_mask(loaded: Loaded, scheme: positions.Scheme, tokens: int, edges) -> np.ndarray | None:
    """The position scheme's masked share per map cell (:func:`core.views.rope_view.mask_cells`, bound at ``tokens``) on
    the map's ``edges``, or None for a scheme without a mask (kept: it does not depend on tau)."""
    edges = tuple(int(e) for e in edges)

    def work():
        return rope_view.mask_cells(scheme.bind(loaded.train_length, int(tokens)), np.asarray(edges))

    if scheme.entry.mask is None:
        return None
    return stores()["rpe"].get((mkey(loaded), "scheme-mask", scheme, int(tokens), edges), work)


# -- runs ---------------------------------------------------------------------------


def _run_key(loaded: Loaded, doc_key: Hashable, choice: Choice, how: Pass) -> tuple:
    return (mkey(loaded), doc_key, attention_key(choice), how.probes, how.max_new_tokens, how.generate)


#: Seconds a person's pass waits at most for the background pass that is making that very pass (then it runs its own).
BACKGROUND_WAIT_S = 600.0


def _run_doc(
    loaded: Loaded, doc_key: Hashable, doc, choice: Choice, how: Pass = DEFAULT_PASS, guarded: bool = True
) -> engine.Result:
    key = _run_key(loaded, doc_key, choice, how)
    # Refuse a too-long input first, also on a cache hit (free memory changes); the message is the engine's own.
    # Checking before tokenising matters: slow tokenizers need seconds for a long text.
    n = doc.meta.get("tokens") if doc.task in tasks.TASKS else None  # a pasted text's window keeps the full text's meta
    n = n or len(loaded.tokenizer(doc.text).input_ids)
    engine.check_length(loaded, int(n))
    res = stores()["run"].peek(key)
    if res is MISSING and guarded and gate().wait_for_background(key, BACKGROUND_WAIT_S):
        res = stores()["run"].peek(key)  # the background pass under way was this very one: its rest, not a new pass
    if res is MISSING:

        def compute() -> engine.Result:
            return engine.run(loaded, doc, choice, how, encoded=encoded(loaded, doc_key, doc))

        # get() re-checks the store under the gate: the prefetcher may have just made this very pass
        with gate().foreground() if guarded else contextlib.nullcontext():
            res = stores()["run"].get(key, compute)
        _note_stats(loaded, doc_key, choice, how, res)
    return res if res.method == choice.method else replace(res, method=choice.method)


def run_key(loaded: Loaded, req: DocumentRequest, choice: Choice, how: Pass = DEFAULT_PASS) -> tuple:
    """The run store's key of the request's pass under ``choice`` and ``how`` (what :func:`run` looks up)."""
    return _run_key(loaded, req, choice, how)


def has_run(loaded: Loaded, req: DocumentRequest, choice: Choice, how: Pass = DEFAULT_PASS) -> bool:
    """Whether :func:`run` would answer from the store (no pass)."""
    return stores()["run"].peek(_run_key(loaded, req, choice, how)) is not MISSING


def run_unguarded(loaded: Loaded, req: DocumentRequest, choice: Choice, how: Pass = DEFAULT_PASS) -> engine.Result:
    """:func:`run` for a caller that already holds the pass gate (the prefetcher)."""
    return _run_doc(loaded, req, document(loaded, req), choice, how, guarded=False)


def grid_key(loaded: Loaded, doc_key: Hashable, choice: Choice) -> tuple:
    """Key of one document's statistics under one choice (tau, targets, CosScale, position scheme): what
    Algorithm 1 needs of a pass, whatever else it recorded."""
    return (mkey(loaded), doc_key, attention_key(choice))


def _note_stats(loaded: Loaded, doc_key: Hashable, choice: Choice, how: Pass, res: engine.Result) -> None:
    """Keep a run's per-layer Pmax/H by (document, tau): any later Algorithm 1 on this document reads it."""
    if res.probes is not None and how.probes.stats and res.probes.pmax.size:
        stats = temperature.LayerStats(pmax=res.probes.layer_pmax, entropy=res.probes.layer_entropy)
        stores()["grid"].get(grid_key(loaded, doc_key, choice), lambda: stats)


def known_stats(loaded: Loaded, doc_key: Hashable, tau: Any, base: Choice = TRAINED):
    """The stored :class:`core.runs.temperature.LayerStats` of a document at ``tau`` under ``base``'s targets, CosScale
    and scheme, or None."""
    v = stores()["grid"].peek(grid_key(loaded, doc_key, base.with_(tau=tau)))
    return None if v is MISSING else v


def run(loaded: Loaded, req: DocumentRequest, choice: Choice, how: Pass = DEFAULT_PASS) -> engine.Result:
    """One run of the request's document under ``choice`` and ``how`` (cached by every part that changes the
    result; not the method label)."""
    return _run_doc(loaded, req, document(loaded, req), choice, how)


def run_reference(
    loaded: Loaded, req: DocumentRequest, base: Choice = TRAINED, probes: ProbeSpec | None = None
) -> engine.Result:
    """The L_tr counterpart at tau = 1 under ``base``'s targets, CosScale and position scheme (plain RoPE, as
    trained, unless it says otherwise), no generation: the reference the meters compare with."""
    probes = probes or ProbeSpec(heatmap=False, sorted_logits=True, cosine_hist_bins=0)
    return _run_doc(
        loaded,
        ("ref", req),
        reference_document(loaded, req),
        base.with_(method=methods.AS_TRAINED, tau=ONE),
        Pass(probes=probes, generate=False),
    )


#: Pooled heatmap cells per side on the Explore page (<= 512): enough to see the needle, cheap to pool and to ship.
HEATMAP_SIZE = 256


#: What Explore records of the decoder while it writes the answer: where the answer looks (map and profile).
EXPLORE_NAMES = ("cross.*.map", "cross.*.profile")


def explore_probes(layer: int, head: int | None) -> ProbeSpec:
    """What the Explore page records: stats, one pooled heatmap, the question profile, and the answer's
    cross-attention over the document (:data:`EXPLORE_NAMES`).

    No sorted logits and no cosine histogram: those feed the Theory page
    only, and sorting layer 0's L x L logits costs as much as the rest of
    the probes together.
    """
    return ProbeSpec(
        heatmap_layer=int(layer),
        heatmap_head=head,
        heatmap_size=HEATMAP_SIZE,
        sorted_logits=False,
        cosine_hist_bins=0,
        names=EXPLORE_NAMES,
    )


# -- temperature --------------------------------------------------------------------


def resolve_tau(
    loaded: Loaded,
    req: DocumentRequest,
    method: str,
    base: Choice = TRAINED,
    tau: Any = None,
    samples: int = 1,
    progress: Progress = None,
    compute: bool = True,
    params: dict | None = None,
) -> tuple[Any, dict] | None:
    """(schedule, info) for a method on this document, via :func:`core.runs.methods.resolve`; a measured method's
    passes run under ``base``'s targets, CosScale and position scheme. ``tau``: a fixed method's value; ``params``:
    the method's own number (the sidebar's gamma box), part of the key (the part it takes)."""
    entry = methods.get(method)
    if entry.takes_value:
        if tau is None:
            raise UserError(
                f"Method '{method}' needs a tau", app=f"Method '{entry.label}' needs a tau: move the tau slider."
            )
        return Schedule.of(tau), {}
    own = methods.own_params(method, params)
    key = (mkey(loaded), req, method, attention_key(base.with_(tau=ONE)), samples, tuple(sorted((own or {}).items())))
    if not compute:
        v = stores()["tau"].peek(key)
        return None if v is MISSING else v
    doc = document(loaded, req)
    if entry.measured:
        engine.check_length(loaded, token_count(loaded, req))
    if entry.grid_criterion is not None and samples <= 1:
        # Algorithm 1 by bisection on the shared grid (the passes the slider and Calibrate use too).
        def work():
            cal = calibrate_both(loaded, req, base, fast=True, samples=1, progress=progress)[entry.grid_criterion]
            return Schedule.of(cal.tau), {
                "source": "resolved",
                "length": token_count(loaded, req),
                "train_length": loaded.train_length,
                **cal.to_dict(),
            }
    else:

        def work():
            with gate().foreground():
                return methods.resolve(
                    loaded, doc, method, None, samples=samples, base=base, progress=progress, params=own
                )

    return stores()["tau"].get(key, work)


def calibrate_both(
    loaded: Loaded,
    req: DocumentRequest,
    base: Choice = TRAINED,
    fast: bool = False,
    samples: int = 1,
    progress: Progress = None,
    compute: bool = True,
) -> dict[str, temperature.Calibration] | None:
    """:func:`core.runs.calibration.both_criteria` at the document's length, on the process's shared passes, under
    ``base``'s targets, CosScale and position scheme (its L_tr reference passes bind the scheme at L_tr)."""
    base = base.with_(tau=ONE)
    key = (mkey(loaded), req, fast, samples, attention_key(base))
    if not compute:
        v = stores()["cal"].peek(key)
        return None if v is MISSING else v

    def work():
        doc = document(loaded, req)
        engine.check_length(loaded, token_count(loaded, req))
        if samples <= 1:
            # One document: the passes are the ones the slider and the prefetcher
            # make of this very document (and its L_tr reference), so read and
            # fill the shared grid instead of running them again.
            reference = shared_measure(loaded, req, ("ref", req), reference_document(loaded, req), base)(1.0)
            meas = shared_measure(loaded, req, req, doc, base)
        else:
            meas, reference = calibration.measures(loaded, doc, samples, base)
        return calibration.both_criteria(meas, reference, fast=fast, progress=progress)

    def guarded():
        with gate().foreground():
            return work()

    return stores()["cal"].get(key, guarded)


def shared_measure(
    loaded: Loaded, req: DocumentRequest, doc_key: Hashable, doc, base: Choice = TRAINED
) -> Callable[[Any], temperature.LayerStats]:
    """``measure(tau)`` for Algorithm 1 on one document under ``base``'s targets, CosScale and position scheme,
    reading the shared grid first.

    A miss runs a stats-only pass (no generation) through the gate and
    stores its statistics, so the slider, the prefetcher and Calibrate never
    compute the same document at the same tau twice in this process.
    """
    how = Pass(probes=ProbeSpec.stats_only(), generate=False)

    def fn(tau) -> temperature.LayerStats:
        hit = known_stats(loaded, doc_key, tau, base)
        if hit is not None:
            return hit
        _run_doc(loaded, doc_key, doc, base.with_(tau=tau), how)
        return known_stats(loaded, doc_key, tau, base)

    return fn


def logit_stats(loaded: Loaded, req: DocumentRequest, base: Choice = TRAINED) -> dict:
    """sigma and l_max at this length and at L_tr, and Pmax at L_tr (inputs of Prop. 1 and 2), under ``base``'s
    targets, CosScale and position scheme."""
    key = (mkey(loaded), req, "logit_stats", attention_key(base.with_(tau=ONE)))

    def work():
        # The same two passes the Theory page draws (and the prefetcher computes ahead): one per document and length.
        ex = run(loaded, req, *theory_pass(loaded, base))
        tr = run_reference(loaded, req, base)
        return calibration.logit_stats_of(ex, tr, loaded.train_length)

    return stores()["stats"].get(key, work)


def theory_pass(loaded: Loaded, base: Choice = TRAINED) -> tuple[Choice, Pass]:
    """The tau = 1 pass with layer 0's sorted logits (and cos(q, k) for cosine models), no generation, under
    ``base``'s targets, CosScale and position scheme, as its two values: what the Theory page and Prop. 1/2 read,
    one key for both."""
    spec = ProbeSpec(heatmap=False, sorted_logits=True, cosine_hist_bins=60 if loaded.cosine else 0)
    return base.with_(method=methods.AS_TRAINED, tau=ONE), Pass(probes=spec, generate=False)


def closed_forms(loaded: Loaded, req: DocumentRequest, base: Choice = TRAINED, params: dict | None = None) -> dict:
    """:func:`core.runs.methods.closed_forms` for the request's document (Prop. 1/2 read :func:`logit_stats`' two passes);
    ``params``: the sidebar's gamma and kin, for the methods that take them."""
    return methods.closed_forms(
        loaded.train_length, token_count(loaded, req), loaded.d_kv, logit_stats(loaded, req, base), params
    )


def length_stats(loaded: Loaded, req: DocumentRequest, compute: bool = True) -> dict | None:
    """tau = 1 layer-0 logit statistics (sigma, l_max, Pmax) of the request's document, no generation."""
    key = (mkey(loaded), req, "length_stats")
    if not compute:
        v = stores()["stats"].peek(key)
        return None if v is MISSING else v

    def work():
        spec = ProbeSpec(heatmap=False, sorted_logits=True, cosine_hist_bins=0)
        return calibration.length_stats_of(
            run(loaded, req, Choice.of(tau=1.0, method=methods.AS_TRAINED), engine.Pass(probes=spec, generate=False))
        )

    return stores()["stats"].get(key, work)


# -- rpe ----------------------------------------------------------------------------


def bias_curves(loaded: Loaded, query: int, length: int) -> np.ndarray:
    """b(m, n) per head for keys 0..length-1 (raises UserError for models without a relative bias)."""

    def work():
        try:
            return rpe.bias_curves(loaded.model, query, length)
        except ValueError as err:
            raise UserError(str(err)) from None

    return stores()["rpe"].get((mkey(loaded), int(query), int(length)), work)
