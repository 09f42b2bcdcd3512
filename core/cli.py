"""``python -m core run | calibrate | sweep | rpe | train``: the headless contract.

Exit status 0 on success; 2 with a one-line message on bad input (unknown
model, empty text, too long for memory, NaN attention, bad option). JSON goes
to stdout; progress bars go to stderr, so ``--json`` output can be piped.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace

import numpy as np

from core.errors import UserError
from core.tasks import MAX_ANSWER_TOKENS

TASK_CHOICES = ("passkey", "line", "topic", "multidoc", "code", "text")


def _common(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model and document")
    g.add_argument("--model", help="registry name, hub id or local folder (default: the bundled model)")
    g.add_argument("--train-length", type=int, help="override the model's training length L_tr")
    g.add_argument("--device", help="cpu | cuda | auto (default: CUDA+bf16 when present, else CPU+fp32)")
    g.add_argument("--settings", help="a settings JSON (the app's export); explicit options override it")
    g.add_argument("--task", choices=TASK_CHOICES)
    g.add_argument("--tokens", type=int, help="document length in tokens (default: L_tr)")
    g.add_argument("--depth", type=float, help="needle depth 0..1 (default 0.5)")
    g.add_argument("--seed", type=int)
    g.add_argument("--text-file", help="task text: your document (UTF-8)")
    g.add_argument("--needle", help="task text: sentence to insert (default: a pass key sentence)")
    g.add_argument("--question")
    g.add_argument("--expected")
    t = p.add_argument_group("temperature")
    t.add_argument("--tau", type=float, help="a fixed tau for every targeted attention")
    t.add_argument("--method", choices=("none", "log-length", "infoscale", "pmax", "entropy", "prop1", "prop2", "per-layer"))
    t.add_argument("--targets", default=None, help="comma list of encoder,decoder,cross (default: encoder)")
    t.add_argument("--cosine-scale", type=float, help="CosScale s for cosine-attention models")
    t.add_argument("--samples", type=int, default=1, help="documents used to calibrate measured methods")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m core", description="Attention Alignment Explorer, headless.")
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="answer one document and report attention statistics")
    _common(r)
    r.add_argument("--json", action="store_true", help="print one JSON object")
    c = sub.add_parser("calibrate", help="Algorithm 1 (grid) plus every method's tau for one document")
    _common(c)
    c.add_argument("--criterion", choices=("pmax", "entropy"), default="pmax")
    c.add_argument("--fast", action="store_true", help="bisect instead of the full grid")
    c.add_argument("--json", action="store_true")
    s = sub.add_parser("sweep", help="accuracy over lengths x depths x seeds x methods -> CSV")
    _common(s)
    s.add_argument("--lengths", default=None, help="comma list of token counts, or multiples like 1x,2x,4x of L_tr")
    s.add_argument("--depths", default="0.5", help="comma list of depths 0..1")
    s.add_argument("--methods", default=None,
                   help="comma list of method names and/or fixed taus (default: none,log-length; with --data: "
                        "the --settings/--tau/--method choice)")
    s.add_argument("--out", help="CSV written row by row")
    s.add_argument("--resume", action="store_true", help="skip rows already in --out")
    s.add_argument("--data", help="JSONL of your own documents (see README, batch runs)")
    s.add_argument("--batch-size", type=int, default=8, help="--data: documents per padded batch")
    s.add_argument("--max-new-tokens", type=int, default=MAX_ANSWER_TOKENS, help="--data: answer length limit in tokens")
    rp = sub.add_parser("rpe", help="relative-position-bias curves b(m, n) per head (Figure 1)")
    rp.add_argument("--model")
    rp.add_argument("--train-length", type=int)
    rp.add_argument("--query", type=int, default=None, help="query position m (default: L_tr // 2)")
    rp.add_argument("--length", type=int, default=None, help="keys 0..length-1 (default: 4 L_tr)")
    rp.add_argument("--out", required=True)
    sub.add_parser("train", help="train a bundled model: python -m core train --help")
    return p


def _settings(args):
    """Merge a --settings file with explicit options (options win)."""
    from core.settings import Settings

    base = Settings.load(args.settings) if getattr(args, "settings", None) else Settings()
    doc = base.document
    text = None
    if getattr(args, "text_file", None):
        try:
            with open(args.text_file, encoding="utf-8") as f:
                text = f.read()
        except OSError as err:
            raise UserError(f"Cannot read --text-file: {err}") from None
    over = {k: v for k, v in {
        "task": args.task or ("text" if text is not None else None), "tokens": args.tokens, "depth": args.depth,
        "seed": args.seed, "text": text, "needle": args.needle, "question": args.question, "expected": args.expected,
    }.items() if v is not None}
    doc = replace(doc, **over) if over else doc
    method = base.method
    tau = base.tau
    if args.tau is not None:
        method, tau = "fixed", args.tau
    elif args.method:
        method, tau = args.method, None
    targets = tuple(t.strip() for t in args.targets.split(",")) if args.targets else base.targets
    return Settings(
        model=args.model or base.model,
        train_length=args.train_length or base.train_length,
        method=method, tau=tau, criterion=base.criterion, targets=targets,
        cosine_scale=args.cosine_scale if args.cosine_scale is not None else base.cosine_scale,
        chosen_at=base.chosen_at, document=doc,
    )


def _load(model: str | None, train_length: int | None, device: str | None = None):
    from core.errors import ModelLoadError
    from core.models import default_model, load

    name = model or default_model()
    if name is None:
        raise ModelLoadError("No model given and no bundled model in assets/models: pass --model NAME|HUB_ID|FOLDER")
    return load(name, device=device, train_length=train_length)


def _progress(desc: str):
    from tqdm import tqdm

    bar = tqdm(total=100, desc=desc, file=sys.stderr, leave=False, bar_format="{l_bar}{bar}| {elapsed}")

    def update(frac: float) -> None:
        bar.n = int(round(100 * frac))
        bar.refresh()

    update.close = bar.close  # type: ignore[attr-defined]
    return update


def cmd_run(args) -> int:
    from core import calibration, engine

    st = _settings(args)
    loaded = _load(st.model, st.train_length, args.device)
    doc = st.document.build(loaded.tokenizer, loaded.train_length)
    prog = _progress("calibrating") if st.method in ("pmax", "entropy", "per-layer") else None
    # a stored schedule is used at the length it was chosen at; any other length re-resolves it
    tau, info = calibration.resolve(loaded, doc, st.method, st.tau, samples=args.samples, progress=prog, chosen_at=st.chosen_at)
    if prog:
        prog.close()
    res = engine.run(loaded, doc, engine.RunSettings(tau=tau, method=st.method, targets=st.targets, cosine_scale=st.cosine_scale))
    out = res.summary()
    out["model"] = loaded.spec.name
    if args.json:
        print(json.dumps(out))
    else:
        mark = {True: "correct", False: "wrong", None: "-"}[res.correct]
        print(f"model {loaded.spec.name}  tokens {res.tokens} ({res.tokens / res.train_length:.1f}x L_tr={res.train_length})  "
              f"method {st.method}  tau {np.round(res.tau.mean(1), 3).tolist()}")
        print(f"answer: {res.answer!r}  expected: {res.expected!r}  [{mark}]  {res.seconds['total']:.3f}s")
        for layer in res.layers():
            print(f"  layer {layer['layer']}: Pmax {layer['pmax']:.4f}  H {layer['entropy']:.4f}")
    return 0


def cmd_calibrate(args) -> int:
    from core import calibration

    st = _settings(args)
    loaded = _load(st.model, st.train_length, args.device)
    doc = st.document.build(loaded.tokenizer, loaded.train_length)
    prog = _progress(f"Algorithm 1 ({args.criterion})")
    cal = calibration.calibrate(loaded, doc, args.criterion, fast=args.fast, samples=args.samples, progress=prog)
    prog.close()
    methods = calibration.all_methods(loaded, doc, samples=args.samples)
    methods[args.criterion] = cal.tau
    out = {**cal.to_dict(), "methods": methods, "tokens": len(loaded.tokenizer(doc.text).input_ids),
           "train_length": loaded.train_length, "model": loaded.spec.name}
    if args.json:
        print(json.dumps(out))
    else:
        print(f"Algorithm 1 ({cal.criterion}) at {out['tokens']} tokens: tau = {cal.tau}  (reference S_tr(1) = {cal.reference:.4f}, {cal.passes} passes)")
        for t, v in zip(cal.grid, cal.curve):
            print(f"  tau {t:.2f}: {'-' if v is None else f'{v:.4f}'}")
        for m, t in methods.items():
            print(f"  {m:>10}: {t if isinstance(t, str) else np.round(t, 4).tolist()}")
    return 0


def _lengths(spec: str | None, train_length: int) -> list[int]:
    if not spec:
        return [train_length * k for k in (1, 2, 4, 8, 16)]
    out = []
    for part in spec.split(","):
        part = part.strip().lower()
        out.append(int(round(float(part[:-1]) * train_length)) if part.endswith("x") else int(part))
    return out


def cmd_sweep(args) -> int:
    st = _settings(args)
    loaded = _load(st.model, st.train_length, args.device)
    if args.data:
        from core.batch import run_jsonl

        return run_jsonl(loaded, args, st)
    from tqdm import tqdm

    from core.sweep import SweepPlan, run_sweep

    try:
        plan = SweepPlan(
            model=loaded.spec.name, task=st.document.task if st.document.task != "text" else "passkey",
            lengths=_lengths(args.lengths, loaded.train_length),
            depths=[float(d) for d in args.depths.split(",")],
            seeds=[(st.document.seed or 0) + i for i in range(max(1, args.samples))],
            methods=[m.strip() for m in (args.methods or "none,log-length").split(",") if m.strip()],
        )
    except ValueError as err:
        raise UserError(f"Bad sweep option: {err}") from None
    bar = tqdm(total=plan.total, desc="sweep", file=sys.stderr)

    def progress(done: int, total: int, row) -> None:
        bar.n = done
        bar.refresh()

    df = run_sweep(loaded, plan, out=args.out, resume=args.resume, progress=progress)
    bar.close()
    if not args.out:
        print(df.to_csv(index=False), end="")
    else:
        from core.sweep import accuracy_table

        print(accuracy_table(df).to_string() if len(df) else "nothing new to run")
    return 0


def cmd_rpe(args) -> int:
    import pandas as pd

    from core.rpe import bias_curves

    loaded = _load(args.model, args.train_length)
    lt = loaded.train_length
    length = args.length or 4 * lt
    m = args.query if args.query is not None else min(lt // 2, length - 1)
    curves = bias_curves(loaded.model, m, length)
    df = pd.DataFrame({"n": np.arange(length), "distance": np.arange(length) - m})
    for h, c in enumerate(curves):
        df[f"head{h}"] = c
    df.to_csv(args.out, index=False)
    print(f"wrote {args.out}: {curves.shape[0]} heads x {length} keys, query m={m}, L_tr={lt}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        if argv[:1] == ["train"]:  # its options belong to core.train's own parser
            from core.train import main as train_main

            return train_main(argv[1:])
        args = _parser().parse_args(argv)
        return {"run": cmd_run, "calibrate": cmd_calibrate, "sweep": cmd_sweep, "rpe": cmd_rpe}[args.cmd](args)
    except (UserError, ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except MemoryError:
        print("error: out of memory: use a shorter document", file=sys.stderr)
        return 2
