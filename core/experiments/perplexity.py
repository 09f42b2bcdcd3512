"""Language-modelling perplexity over lengths x methods: the paper's Table 3, for any LM-adapted T5.

The encoder reads a prefix of ``L_ex`` tokens of held-out prose, the decoder
is scored on the ``continuation`` tokens that follow (teacher-forced:
:func:`core.runs.engine.run_encoded` sums their -log p for documents of task
``"lm"``). A cell (one length, one method) is ``sequences`` distinct
sequences, seeds ``seed .. seed + sequences - 1`` (:mod:`core.data.tasks.lm`:
each seed is its own shuffle of the held-out pool, and the same seed asks for
the same continuation at every length), and its perplexity is
``exp(sum of -log p / tokens scored)`` over all of them (the corpus-level
perplexity language-modelling papers report, not a mean of per-sequence
perplexities, which one bad sequence would dominate).

Methods come from :mod:`core.runs.methods`, resolved once per length exactly as a
retrieval sweep does (:func:`core.experiments.sweep.resolve_for`): measured methods
(Algorithm 1, Prop. 1/2, per-layer) calibrate on sequences whose seeds
(``calib_seed`` on) are disjoint from the scored ones. A search's row says,
as a sweep row does, whether its curve ``reached`` the L_tr reference and the
``gap`` left (empty for methods that are not searches).

Sequences with and without an earlier copy are scored apart when asked
(``copies``, the ``copy`` column): the paper's effect lives in the copy,
since a model can only lose by dispersion what it reads from far back
(docs/models.md, "A language model for Table 3"). ``"with"`` is the first
``sequences`` seeds from ``seed`` on whose sequence at this length holds a copy
of its continuation (:mod:`core.data.tasks.lm`, ``repeat=1``); ``"without"`` is the
*same* seeds with no copy (``repeat=0``: the same continuation after the same
kind of past, paired seed by seed, so the two rows differ only in the copy);
``"mixed"`` (the default) is seeds ``seed ..`` as held out, about half with a
copy. A row's ``first_seed`` and ``last_seed`` bound the seeds it scored.

On a decoder-only LM (``Loaded.decoder_only``: SmolLM2 and the other causal families) a cell scores *every*
token of each held-out sequence of ``tokens`` tokens (the same prefix a T5 encoder would read; no continuation
is needed), teacher-forced, each token predicted from all before it (:func:`token_nll`: one pass per sequence,
since a left-padded batch would shift a causal LM's positions). That is how long-context LM papers measure
perplexity past L_tr, and it lets a row say *where* the loss grows: ``nll_0-0.5x`` ... ``nll_16x-`` are the
mean per-token NLL of the tokens at positions ``[0, L_tr/2)``, ``[L_tr/2, L_tr)``, ``[L_tr, 2 L_tr)`` ... of
the sequence (:data:`BUCKETS`; empty where the sequence has no such tokens, and on T5, whose scored tokens
all follow the prefix). Every row, either family, gives ``nll_per_token`` (the mean over its sequences of each
sequence's mean per-token NLL) and ``nll_se``, a bootstrap standard error of that mean over sequences
(:data:`BOOTSTRAP` resamples, seeded: the same rows give the same SE).

A plan's ``schemes`` (position schemes, :class:`core.values.positions.Scheme`, as ``mlm --schemes`` names them)
are a second axis beside the methods: every cell runs under its scheme's :class:`~core.values.choice.Choice`
(``scheme`` and ``scheme_params`` columns), a measured method resolved under the same scheme.

Rows are written as they finish to a CSV through :class:`core.experiments.csvio.ResultCSV`
(lock, ``resume``, spreadsheet-safe cells), one row per length x method. A
method's own number (critical scaling's gamma, ``params``) goes to the methods
that take it and is named in their rows' ``method`` (``critical:gamma=0.2``), as
in a retrieval sweep, so a resumed table at another gamma runs its own rows.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable
from contextlib import AbstractContextManager as ContextManager
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from core.data import tasks
from core.data.tasks.lm import COPY_KINDS, COPY_MIXED, COPY_ROOM, COPY_WITH, COPY_WITHOUT  # the kinds: the CLI's too
from core.errors import NumericalError, UserError
from core.experiments import csvio
from core.experiments.sweep import (  # a method at a length, resumed rows: as retrieval sweeps do
    acts_plain_cell,
    resolve_for,
    row_scheme,
    typed_rows,
)
from core.kinds import ENCODER
from core.mechanics.probes import ProbeSpec
from core.mechanics.run_pass import Pass
from core.models import Loaded
from core.runs import engine, methods, timing
from core.runs.methods import method_label
from core.values.choice import Choice
from core.values.positions import PLAIN_SCHEME, Scheme
from core.values.validation import NewTokens, held_out_plan

COLUMNS = [
    "model",
    "task",
    "tokens",
    "actual_tokens",
    "train_length",
    "scheme",
    "scheme_params",
    "method",
    "copy",
    "tau",
    "perplexity",
    "nll",
    "scored_tokens",
    "nll_per_token",
    "nll_se",
    "sequences",
    "first_seed",
    "last_seed",
    "seconds",
    "reached",
    "gap",
]
#: Position buckets of a decoder-only LM's scored tokens, in units of L_tr: ``[lo, hi)`` (None: no end).
BUCKETS: tuple[tuple[float, float | None], ...] = ((0, 0.5), (0.5, 1), (1, 2), (2, 4), (4, 8), (8, 16), (16, None))


def bucket_column(lo: float, hi: float | None) -> str:
    """A bucket's CSV column: ``nll_0-0.5x``, ``nll_1-2x``, ``nll_16x-``."""
    return f"nll_{lo:g}-{hi:g}x" if hi is not None else f"nll_{lo:g}x-"


BUCKET_COLUMNS: list[str] = [bucket_column(lo, hi) for lo, hi in BUCKETS]
COLUMNS += BUCKET_COLUMNS
KEY = ("model", "tokens", "scheme", "scheme_params", "method", "copy")
#: Bootstrap resamples of a cell's sequences for ``nll_se`` (seeded, :func:`bootstrap_se`).
BOOTSTRAP = 2000
#: Rows of the vocabulary's logits made at once when a decoder's tokens are scored (a 32k-token pass would
#: otherwise hold 32k x vocabulary floats: 6 GiB for SmolLM2).
LOGIT_ROWS = 1024
#: The ``copy`` field of ``perplexity --json`` rows: null (mixed), true, false.
COPY_JSON = {COPY_MIXED: None, COPY_WITH: True, COPY_WITHOUT: False}
#: Seeds searched per sequence asked for with a copy (about 3 in 4 held-out seeds have one from ~110 tokens on).
COPY_SEARCH = 4


@dataclass
class PerplexityPlan:
    """What to measure: prefix ``lengths`` x ``methods``, ``sequences`` held-out sequences per cell."""

    model: str
    lengths: list[int]
    methods: list[str]
    sequences: int = 200
    seed: int = 0
    calib_seed: int = 100_000
    calib_samples: int = 4
    continuation: int = tasks.CONTINUATION
    batch_size: int = 8
    targets: tuple[str, ...] = (ENCODER,)
    haystack: str = "corpus-eval"
    task: str = tasks.LM  # what core.experiments.sweep.resolve_for builds calibration documents of
    copies: tuple[str, ...] = (COPY_MIXED,)  # COPY_KINDS: which sequences each length x method scores
    #: position schemes (Scheme, or texts such as ``yarn-rope`` that :meth:`validated` makes into them)
    schemes: tuple[Scheme | str, ...] = (PLAIN_SCHEME,)
    #: the value of a method's :class:`core.runs.methods.Param` by name (``{"gamma": 0.2}``), for the methods that take it
    params: dict[str, float] = field(default_factory=dict)

    @property
    def total(self) -> int:
        """Sequences to run in all (the progress unit: a 16x cell is many times a 1x one)."""
        return len(self.lengths) * len(self.methods) * self.sequences * len(self.copies) * len(self.schemes)

    def validated(self) -> PerplexityPlan:
        """This plan with methods as labels and every bound checked, or a :class:`UserError` naming the option."""
        bad = [c for c in self.copies if c not in COPY_KINDS]
        if bad or not self.copies:
            raise UserError(
                f"Bad perplexity option: copies wants some of {', '.join(COPY_KINDS)}, got {list(self.copies)!r}"
            )
        plan = held_out_plan(self, "Bad perplexity option", method_label, continuation=NewTokens)
        if not self.schemes:
            raise UserError("Bad perplexity option: at least one position scheme")
        schemes = tuple(Scheme.of(t) for t in self.schemes)
        if len(set(schemes)) != len(schemes):
            raise UserError(f"Bad perplexity option: schemes: {', '.join(map(str, schemes))} lists one scheme twice")
        plan = replace(
            plan,
            schemes=schemes,
            copies=tuple(dict.fromkeys(self.copies)),
            params=methods.check_params(self.params, plan.methods, "Bad perplexity option"),
        )
        last = plan.seed + COPY_SEARCH * plan.sequences
        if (
            set(plan.copies) - {COPY_MIXED}
            and plan.seed < plan.calib_seed + plan.calib_samples
            and plan.calib_seed < last
        ):
            raise UserError(
                f"Bad perplexity option: calibration seeds {plan.calib_seed}.. overlap the seeds searched for "
                f"sequences with a copy ({plan.seed}..{last - 1}); no method may be tuned on what it is scored on"
            )
        return plan


def sequences(loaded: Loaded, tokens: int, plan: PerplexityPlan, copy: str = COPY_MIXED) -> list[tasks.Document]:
    """The cell's held-out sequences at ``tokens``: seeds ``plan.seed`` on, all of them (``copy`` mixed), or
    the first ``plan.sequences`` with an earlier copy, with it (``"with"``) or without it (``"without"``);
    a :class:`UserError` when too few seeds have a copy at this length (a prefix too short to hold one)."""

    def make(seed: int, **kw) -> tasks.Document:
        return tasks.make(
            tasks.LM, loaded.tokenizer, tokens, seed=seed, haystack=plan.haystack, continuation=plan.continuation, **kw
        )

    if copy == COPY_MIXED:
        return [make(plan.seed + i) for i in range(plan.sequences)]
    found: list[tasks.Document] = []
    for seed in range(plan.seed, plan.seed + COPY_SEARCH * plan.sequences):
        d = make(seed, repeat=1.0)
        if d.meta["repeat"]:
            found.append(d)
            if len(found) == plan.sequences:
                break
    else:
        raise UserError(
            f"only {len(found)} of seeds {plan.seed}..{plan.seed + COPY_SEARCH * plan.sequences - 1} hold an "
            f"earlier copy at {tokens} tokens, fewer than the {plan.sequences} sequences asked for "
            f"(a copy needs about {COPY_ROOM + 8} prefix tokens)"
        )
    return found if copy == COPY_WITH else [make(d.seed, repeat=0.0) for d in found]


def bootstrap_se(values: list[float] | np.ndarray, resamples: int = BOOTSTRAP, seed: int = 0) -> float:
    """The bootstrap standard error of the mean of ``values`` (one per sequence): the standard deviation of the
    means of ``resamples`` resamples with replacement, seeded (0.0 for a single value, which says nothing)."""
    v = np.asarray(values, dtype=float)
    if len(v) < 2:
        return 0.0
    rng = np.random.default_rng(seed)
    means = v[rng.integers(0, len(v), size=(resamples, len(v)))].mean(axis=1)
    return float(means.std(ddof=1))


@torch.inference_mode()
def token_nll(loaded: Loaded, ids: np.ndarray, choice: Choice) -> np.ndarray:
    """A decoder-only LM's -log p of each token of ``ids`` after the ones before it (``len(ids) - 1`` values: the
    first token has no prediction), teacher-forced in one pass under ``choice`` (its tau, targets read for the model
    by :func:`core.runs.engine.choice_for`, and position scheme, through the same
    :func:`core.runs.rope_pass.scheme_pass` as every pass), the vocabulary's logits made :data:`LOGIT_ROWS` rows at
    a time.

    Why here and not :func:`core.runs.engine.run_encoded`: the engine's language-modelling score sums a
    continuation after a prompt (the T5 layout) in a second pass; a causal LM's table wants every token's loss
    from the one pass, by position."""
    from core.runs import rope_pass

    n = len(ids)
    engine.check_length(loaded, n)
    choice = engine.choice_for(loaded, choice)
    how = Pass(generate=False, probes=ProbeSpec.off())
    x = torch.as_tensor(np.asarray(ids), dtype=torch.long)[None].to(loaded.device)
    with rope_pass.scheme_pass(loaded, choice, how, None, n):
        hidden = loaded.model.base_model(input_ids=x).last_hidden_state[0]
    head = loaded.model.get_output_embeddings()
    cap = getattr(loaded.config, "final_logit_softcapping", None)  # Gemma 2's logits pass through a tanh cap
    target = x[0, 1:]
    out = []
    for r0 in range(0, n - 1, LOGIT_ROWS):
        r1 = min(n - 1, r0 + LOGIT_ROWS)
        logits = head(hidden[r0:r1]).float()
        if cap:
            logits = torch.tanh(logits / cap) * cap
        out.append(torch.nn.functional.cross_entropy(logits, target[r0:r1], reduction="none"))
    lost = torch.cat(out).cpu().numpy().astype(np.float64)
    if not np.all(np.isfinite(lost)):
        raise NumericalError(
            f"NaN/inf appeared in the scores with dtype {str(loaded.dtype).replace('torch.', '')}: the logits divided "
            f"by tau (smallest {float(np.min(choice.tau.matrix(loaded.n_layers, loaded.n_heads, rows=n))):g}) left "
            "its range, or the weights hold NaN/inf."
        )
    return lost


def buckets(losses: list[np.ndarray], train_length: int) -> dict[str, float | str]:
    """Mean per-token NLL of the tokens in each position bucket (:data:`BUCKETS`), pooled over sequences; a token
    predicted at index ``i`` of ``losses`` is the sequence's token ``i + 1``. "" for a bucket no token falls in."""
    out: dict[str, float | str] = {}
    for (lo, hi), col in zip(BUCKETS, BUCKET_COLUMNS):
        total, count = 0.0, 0
        for lost in losses:
            pos = np.arange(1, len(lost) + 1)
            sel = (pos >= lo * train_length) & (pos < (hi * train_length if hi is not None else np.inf))
            total += float(lost[sel].sum())
            count += int(sel.sum())
        out[col] = round(total / count, 4) if count else ""
    return out


def score(
    loaded: Loaded,
    docs: list[tasks.Document],
    choice: Choice,
    batch_size: int = 8,
    encoded: list[engine.Encoded] | None = None,
    step: Callable[[int], None] | None = None,
) -> dict:
    """Perplexity of ``docs`` under ``choice`` (no probes, no generation): ``{"perplexity", "nll",
    "scored_tokens", "nll_per_token", "nll_se", "actual_tokens", "seconds"}`` plus, on a decoder-only LM, the
    position buckets (:func:`buckets`).

    T5: the teacher-forced continuation after each prefix; a decoder-only LM: every token of each sequence
    (:func:`token_nll`). ``nll`` is the summed -log p over every scored token; perplexity is
    ``exp(nll / scored_tokens)``; ``nll_per_token`` the mean over sequences of each one's mean, ``nll_se`` its
    bootstrap standard error over sequences. ``step(k)`` is called after each batch of ``k`` sequences."""
    encs = encoded or [engine.encode(loaded, d) for d in docs]
    t0 = time.perf_counter()
    per_doc: list[tuple[float, int]] = []
    extra: dict = {}
    if loaded.decoder_only:
        losses = []
        for enc in encs:
            t = time.perf_counter()
            lost = token_nll(loaded, enc.input_ids, choice)
            # a pass timed, as engine.run times its own: what the note before a calibration scales
            timing.record(timing.model_key(loaded), enc.n, time.perf_counter() - t)
            losses.append(lost)
            per_doc.append((float(lost.sum()), len(lost)))
            if step:
                step(1)
        extra = buckets(losses, loaded.train_length)
    else:
        how = Pass(generate=False, probes=ProbeSpec.off())
        for b in range(0, len(docs), batch_size):
            for r in engine.run_encoded(loaded, docs[b : b + batch_size], encs[b : b + batch_size], choice, how):
                per_doc.append((r.nll, r.scored_tokens))
            if step:
                step(len(docs[b : b + batch_size]))
    nll = sum(v for v, _ in per_doc)
    count = sum(k for _, k in per_doc)
    if not count:
        raise UserError("no tokens were scored")
    means = [v / k for v, k in per_doc if k]
    return {
        "perplexity": math.exp(nll / count),
        "nll": nll,
        "scored_tokens": count,
        "nll_per_token": float(np.mean(means)),
        "nll_se": bootstrap_se(means),
        "actual_tokens": int(round(np.mean([e.n for e in encs]))),
        "seconds": time.perf_counter() - t0,
        **extra,
    }


def run_perplexity(
    loaded: Loaded,
    plan: PerplexityPlan,
    out: str | Path | None = None,
    resume: bool = False,
    progress: Callable[[int, int, dict | None], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
    guard: Callable[[], ContextManager] = contextlib.nullcontext,
    calibrating: Callable[[int, str, Scheme], methods.Progress] | None = None,
) -> pd.DataFrame:
    """Run the plan; append one row per length x method to ``out`` (CSV) as it finishes; return the table.

    ``progress(done, total, row)`` counts sequences (called after each batch,
    ``row`` set when a cell ends); ``should_stop()`` is polled between cells;
    ``guard()`` wraps each cell's passes (the app's pass gate). ``calibrating(tokens, method, scheme)``: the
    progress of a measured method's calibration at that length (told 0.0 as its passes start, then its search's
    steps); why: at 2x L_tr of a real LM it is many minutes of passes before the cell's first sequence."""

    plan = plan.validated()
    if plan.lengths and plan.methods:
        engine.check_length(loaded, max(plan.lengths), 1 if loaded.decoder_only else plan.batch_size)
        for scheme in plan.schemes:
            rope_bound_check(loaded, scheme)
    path = Path(out) if out else None
    per_cell = plan.sequences
    with csvio.ResultCSV(path, COLUMNS, "perplexity", resume=resume) as sink:
        done_keys = {
            (
                r["model"],
                str(int(float(r["tokens"]))),
                r.get("scheme") or PLAIN_SCHEME.name,
                r.get("scheme_params") or "",
                r["method"],
                r.get("copy") or COPY_MIXED,
            )
            for r in sink.rows
        }
        rows: list[dict] = typed_rows(path) if sink.rows else []
        taus: dict = {}
        done = 0
        if progress:
            progress(0, plan.total, None)
        for n, copy in ((n, c) for n in plan.lengths for c in plan.copies):
            todo = [
                (scheme, m)
                for scheme in plan.schemes
                for m in plan.methods
                if (plan.model, str(n), scheme.name, scheme.params_text(), methods.cell_text(m, plan.params), copy)
                not in done_keys
            ]
            done += (len(plan.methods) * len(plan.schemes) - len(todo)) * per_cell
            if not todo:
                continue
            docs = sequences(loaded, n, plan, copy)
            encs = [engine.encode(loaded, d) for d in docs]
            for scheme, m in todo:
                if should_stop and should_stop():
                    return pd.DataFrame(rows, columns=COLUMNS)

                def step(k: int) -> None:
                    nonlocal done
                    done += k
                    if progress:
                        progress(done, plan.total, None)

                base = Choice.of(targets=plan.targets, scheme=scheme)
                with guard():
                    tau, outcome = resolve_for(
                        loaded,
                        plan,
                        n,
                        m,
                        docs[0],
                        taus,
                        None if scheme.is_plain else base,
                        progress=calibrating(n, m, scheme) if calibrating else None,
                    )
                    choice = base.with_(tau=tau, method=m)
                    lengths = sorted({e.n for e in encs})  # each sequence's pass binds its scheme to its length
                    plain = all(choice.acts_plain(loaded.config, loaded.train_length, k) for k in lengths)
                    shared = _plain_cell(loaded, plan, rows, n, copy, docs, lengths) if plain else None
                    if shared is not None:  # the model's own attention, already scored on these sequences
                        cell = shared
                        step(len(docs))
                    else:
                        cell = score(loaded, docs, choice, plan.batch_size, encs, step)
                row = {
                    "model": plan.model,
                    "task": tasks.LM,
                    "tokens": n,
                    "actual_tokens": cell["actual_tokens"],
                    "train_length": loaded.train_length,
                    "scheme": scheme.name,
                    "scheme_params": scheme.params_text(),
                    "method": methods.cell_text(m, plan.params),
                    "copy": copy,
                    "tau": round(tau.mean(n), 6),
                    "perplexity": round(cell["perplexity"], 4),
                    "nll": round(cell["nll"], 4),
                    "scored_tokens": cell["scored_tokens"],
                    "nll_per_token": round(cell["nll_per_token"], 5),
                    "nll_se": round(cell["nll_se"], 5),
                    "sequences": len(docs),
                    "first_seed": docs[0].seed,
                    "last_seed": docs[-1].seed,
                    "seconds": round(cell["seconds"], 3),
                    **outcome,
                    **{c: cell.get(c, "") for c in BUCKET_COLUMNS},
                }
                rows.append(row)
                sink.write(row)
                if progress:
                    progress(done, plan.total, row)
    return pd.DataFrame(rows, columns=COLUMNS)


#: A row's fields that its passes made (what a cell that acts plain copies from an earlier such cell's row).
PASS_FIELDS = ("actual_tokens", "perplexity", "nll", "scored_tokens", "nll_per_token", "nll_se", *BUCKET_COLUMNS)


def _plain_cell(
    loaded: Loaded,
    plan: PerplexityPlan,
    rows: list[dict],
    n: int,
    copy: str,
    docs: list[tasks.Document],
    lengths: list[int],
) -> dict | None:
    """An earlier row's scores (``seconds`` 0) when its cell was the model's own attention at ``n`` tokens on these
    very sequences (:meth:`Choice.acts_plain`, checked again from its scheme and method); None: score them.

    Why: at or below L_tr, tau = 1, log-length, log-n, YaRN and dynamic NTK all compute the model's own pass, bit
    for bit; a table at 1x runs it once, not once per name (a resumed table reads the earlier row)."""
    for r in rows:
        if (
            str(r.get("model")) != plan.model
            or int(float(r["tokens"])) != n
            or str(r.get("copy") or COPY_MIXED) != copy
            or int(r["sequences"]) != len(docs)
            or int(r["first_seed"]) != docs[0].seed
            or int(r["last_seed"]) != docs[-1].seed
        ):
            continue
        try:
            plain = acts_plain_cell(loaded, plan, lengths, row_scheme(r), str(r["method"]))
        except (UserError, ValueError):
            plain = False
        if plain:
            return {**{f: r[f] for f in PASS_FIELDS}, "seconds": 0.0}
    return None


def rope_bound_check(loaded: Loaded, scheme: Scheme) -> None:
    """Refuse, in one line and before any pass, a position scheme this model cannot run (the scheme pass's own
    check, :func:`core.runs.rope_pass.check`)."""
    from core.runs import rope_pass

    rope_pass.check(loaded, scheme)


def cell_label(scheme: str, scheme_params: str, method: str) -> str:
    """A row's name in a table: the method, after its position scheme when that is not the plain one
    (``yarn-rope + log-length``, ``lm-infinite:window=32 + none``)."""
    if (scheme or PLAIN_SCHEME.name) == PLAIN_SCHEME.name and not scheme_params:
        return method
    return f"{scheme}{':' + scheme_params if scheme_params else ''} + {method}"


def _labelled(df: pd.DataFrame) -> pd.DataFrame:
    """The rows with their table name (:func:`cell_label`) in ``method``: a scheme's rows apart from the plain ones."""
    d = df.copy()
    if "scheme" in d:
        d["method"] = [
            cell_label(str(sc) if isinstance(sc, str) else "", str(sp) if isinstance(sp, str) else "", str(m))
            for sc, sp, m in zip(d["scheme"], d.get("scheme_params", [""] * len(d)), d["method"])
        ]
    return d


def perplexity_table(df: pd.DataFrame, rows: str = "method", cols: str = "tokens") -> pd.DataFrame:
    """Perplexity pivot, method x length: the layout of the paper's Table 3 (a position scheme's rows named
    ``scheme + method``). Rows of more than one kind of sequence (the ``copy`` column) are indexed by (copy,
    method), never averaged together."""
    d = _labelled(df)
    d["perplexity"] = pd.to_numeric(d["perplexity"])
    index: str | list[str] = rows
    if "copy" in d and d["copy"].nunique() > 1 and rows != "copy":
        index = ["copy", rows]
    table = d.pivot_table(index=index, columns=cols, values="perplexity", aggfunc="mean").round(2)
    order = list(dict.fromkeys(zip(d["copy"], d[rows]) if isinstance(index, list) else d[rows]))
    return table.reindex(order)  # the plan's order, not the alphabet's


def nll_table(df: pd.DataFrame) -> pd.DataFrame:
    """Mean per-token NLL ``± bootstrap SE`` over sequences, method (or scheme + method) x length, as text cells:
    Table 3 with its error bars (one kind of sequence per table: the ``copy`` column's first)."""
    d = _labelled(df)
    if "copy" in d and len(d):
        d = d[d["copy"] == d["copy"].iloc[0]]
    d["cell"] = [
        f"{float(m):.3f} ± {float(e):.3f}"
        for m, e in zip(pd.to_numeric(d["nll_per_token"]), pd.to_numeric(d["nll_se"]))
    ]
    table = d.pivot_table(index="method", columns="tokens", values="cell", aggfunc="first")
    return table.reindex(list(dict.fromkeys(d["method"])))


def summary(loaded: Loaded, df: pd.DataFrame) -> dict:
    """The CLI's ``perplexity --json`` object (a stable contract): the model, L_tr and the rows; each row's
    ``copy`` says which sequences it scored (true: with an earlier copy, false: the same seeds without, null:
    the held-out mix)."""
    keep = [c for c in COLUMNS if c not in ("model", "task", "copy", *BUCKET_COLUMNS)]  # copy: its JSON form below
    out = []
    for r in df.to_dict("records"):
        row = {k: (r[k].item() if hasattr(r[k], "item") else r[k]) for k in keep}
        row["by_position"] = {  # a decoder's mean NLL per position bucket (empty on T5)
            c.removeprefix("nll_"): float(r[c]) for c in BUCKET_COLUMNS if r.get(c) not in ("", None) and r[c] == r[c]
        }
        row["copy"] = COPY_JSON[r.get("copy") or COPY_MIXED]  # true / false; null: the held-out mix
        out.append(row)
    return {"model": loaded.spec.name, "train_length": loaded.train_length, "rows": out}
