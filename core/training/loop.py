"""The training loop: :func:`train` (one run: optimiser and schedule, batches from the producers,
periodic evaluation and saves), :func:`train_stages` (a recipe, each stage from the previous
one's weights), the card and recipe every save writes, and the pilot search for CosScale's s."""

from __future__ import annotations

import json
import math
import os
import platform
import random
import sys
import time
import types
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from queue import Empty

import torch

from core.data import tasks
from core.errors import UserError
from core.training.config import TrainConfig, _check_per_task
from core.training.data import _batches, eval_documents
from core.training.model import _block, build_model, get_tokenizer, grow_state, identity_blocks
from core.training.optim import optimizer
from core.training.stages import check_stages, lineage_entries, source_recipe, stage_dir, taught_tasks
from core.training.supervision import CrossAttentionTap, needle_attention_loss


def train_stages(
    cfgs: list[TrainConfig],
    out: str | Path,
    reuse_tokenizer: str | Path | None = None,
    quiet: bool = False,
    device: str | None = None,
    evaluate_at_end: bool = True,
    stages_dir: str | Path = "runs",
) -> dict:
    """Train ``cfgs`` in turn, each from the previous one's weights; the last lands in ``out``.

    Returns the last stage's card with ``stages`` (steps, minutes and metrics of
    each stage), ``minutes_total`` and ``tasks`` (every stage's, in first-taught
    order) added, so the card says what the whole
    recipe cost. Only the last stage runs the final 100-document evaluation.
    When the first stage starts from a folder ``train`` wrote, that folder's
    stages come first (``source_recipe``). ``out/train_config.json`` gets the
    whole recipe, so ``--config out/train_config.json`` retrains it."""
    check_stages(cfgs)
    recipe, stages = source_recipe(cfgs[0].init_from)
    prev, card = None, {}
    for k, cfg in enumerate(cfgs):
        last = k == len(cfgs) - 1
        target = Path(out) if last else stage_dir(out, k, stages_dir)
        if prev is not None:
            cfg.init_from = str(prev)
        if not quiet and len(cfgs) > 1:
            print(f"stage {k + 1}/{len(cfgs)} -> {target}", file=sys.stderr)
        card = train(
            cfg,
            target,
            reuse_tokenizer=reuse_tokenizer if prev is None else prev,
            quiet=quiet,
            evaluate_at_end=last and evaluate_at_end,
            device=device,
            lineage=(recipe, stages),
        )
        recipe, stages = source_recipe(target)
        prev = target
    return card


def evaluate(model, tokenizer, cfg: TrainConfig, n_docs: int, length: int | None = None) -> dict[str, float]:
    """Accuracy per task on fresh seeds (>= EVAL_SEED) at ``length`` (default L_tr), eval haystacks;
    for language modelling, ``lm_perplexity`` on held-out text instead."""
    from core.models import Loaded, ModelSpec
    from core.runs import engine

    model.eval()
    length = length or cfg.train_length
    device = next(model.parameters()).device
    loaded = Loaded(ModelSpec(cfg.name, "", cfg.train_length, "bundled"), model, tokenizer, device, torch.float32)
    out = {}
    for task in cfg.tasks:
        res = engine.run_batch(loaded, eval_documents(tokenizer, cfg, task, n_docs, length), batch_size=16)
        if task == tasks.LM:  # held-out perplexity, not an accuracy
            out["lm_perplexity"] = round(math.exp(sum(r.nll for r in res) / sum(r.scored_tokens for r in res)), 3)
            continue
        out[task] = 100.0 * sum(bool(r.correct) for r in res) / len(res)
    model.train()
    return out


def _try_evaluate(model, tokenizer, cfg: TrainConfig, n_docs: int) -> dict:
    """``{"accuracy": ...}``, or ``{"accuracy": {}, "eval_error": why}`` when the engine refuses.

    Why: an evaluation is a side look, and the engine may refuse it for a
    passing reason (free memory is low while another process runs); that must
    not throw away an hour of training, so the step's record says why instead."""
    try:
        return {"accuracy": evaluate(model, tokenizer, cfg, n_docs)}
    except UserError as err:
        model.train()
        return {"accuracy": {}, "eval_error": str(err)}


@contextmanager
def _main_left_alone():
    """Start spawned processes without them re-running the host's ``__main__``.

    Why: a spawned child first re-runs ``sys.modules["__main__"]`` (by its file or module name) so that objects
    pickled from it resolve. The data producers need nothing from it (their target and arguments live in ``core``),
    and a host may have put anything there: Streamlit installs each script run's module as ``__main__`` and never
    puts the old one back, so after any app run a producer re-ran a whole app page (in the test suite, a Sweep page
    whose temporary CSV was gone: every producer died before step 0). The children are prepared while ``start``
    runs, so the swap lasts only that long."""
    main = sys.modules.get("__main__")
    sys.modules["__main__"] = types.ModuleType("__main__")  # no __file__, no __spec__: the child skips it
    try:
        yield
    finally:
        if main is None:
            sys.modules.pop("__main__", None)
        else:
            sys.modules["__main__"] = main


def train(
    cfg: TrainConfig,
    out: str | Path,
    reuse_tokenizer: str | Path | None = None,
    quiet: bool = False,
    evaluate_at_end: bool = True,
    device: str | None = None,
    lineage: tuple[list[dict], list[dict]] = ([], []),
) -> dict:
    """Train and save to ``out``; returns the card (metrics included).

    ``lineage``: the recipe and stage summaries of what ``cfg.init_from`` holds
    (``source_recipe``); every save writes them, with this run after them, to
    ``out/train_config.json`` and the card (``lineage_entries``).

    ``device``: "cpu", "cuda" or None (CUDA when present). Training runs in
    float32 on either: the models are small, and the app runs them in float32
    on the CPU, so there is no precision gap between training and use.

    ``cfg.family == "rope"``: a masked-LM rotary encoder, trained by :func:`core.training.mlm.train`."""
    if cfg.family != "t5":
        from core.training import mlm

        if cfg.family != mlm.ROPE:
            raise ValueError(f"family must be 't5' or 'rope', got {cfg.family!r}")
        if lineage != ([], []):
            raise ValueError("the rope family trains one stage from scratch (no init_from, no staged recipe)")
        return mlm.train(
            cfg, out, reuse_tokenizer=reuse_tokenizer, quiet=quiet, evaluate_at_end=evaluate_at_end, device=device
        )
    import multiprocessing as mp

    from tqdm import tqdm

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    tokenizer = get_tokenizer(cfg, reuse_tokenizer)
    tasks.check_line_answer(cfg.line_answer)
    _check_per_task("needle_attention", cfg.needle_attention, "weight >= 0", math.inf)
    _check_per_task("last_needle", cfg.last_needle, "chance in [0, 1]", 1.0)
    check_stages([cfg])  # before reading any weights; e.g. another d_kv: equal shapes would load, heads cut anew
    for task, opts in cfg.task_options.items():  # a bad option fails here, not deep in a producer
        try:
            tasks.make(task, tokenizer, cfg.train_length, **opts)
        except ValueError as e:
            raise ValueError(f"task_options[{task!r}]: {e}") from None
    tokenizer.save_pretrained(out)
    model = build_model(cfg, len(tokenizer))
    if cfg.init_from:
        from safetensors.torch import load_file

        state = load_file(str(Path(cfg.init_from) / "model.safetensors"))
        state = grow_state(state, model.state_dict())
        try:
            missing, unexpected = model.load_state_dict(state, strict=False)
        except RuntimeError as err:  # tensor shapes differ: another d_model, d_ff, heads...
            first = next(
                (ln.strip() for ln in str(err).splitlines() if "size mismatch" in ln), str(err).splitlines()[0]
            )
            raise ValueError(f"--init-from {cfg.init_from} has other sizes than this config: {first}") from None
        # Tied embeddings, and blocks the source does not have (e.g. a second
        # decoder layer), may be missing: they start fresh. Anything else must match.
        src_blocks = {_block(k) for k in state} - {None}
        odd = [
            k
            for k in missing
            if not k.endswith("embed_tokens.weight") and k != "lm_head.weight" and _block(k) in src_blocks | {None}
        ]
        if unexpected or odd:
            raise ValueError(f"--init-from {cfg.init_from} does not match this config ({odd[:3]} {unexpected[:3]})")
        if cfg.new_blocks == "identity":
            identity_blocks(model, {_block(k) for k in missing} - src_blocks - {None})
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    model.to(dev).train()
    opt, sched = optimizer(model, cfg)
    ctx = mp.get_context("spawn")
    workers = max(1, cfg.workers)
    queue, stop = ctx.Queue(maxsize=8 * workers), ctx.Event()
    producers = [
        ctx.Process(target=_batches, args=(cfg, str(out), queue, w, stop, os.getpid()), daemon=True)
        for w in range(workers)
    ]
    with _main_left_alone():
        for pr in producers:
            pr.start()
    pending: dict[int, tuple] = {}  # batches that arrived ahead of their step
    finished = 0
    t0 = time.time()
    losses: list[float] = []
    history: list[dict] = []
    bar = tqdm(total=cfg.steps, desc=f"train {cfg.name}", file=sys.stderr, disable=quiet)
    tap = CrossAttentionTap(model) if cfg.needle_attention else None
    looks: list[float] = []  # the needle-attention loss, apart from `losses` (the LM loss)
    steps_done, stopped = cfg.steps, None
    t_first = t_last = t0
    try:
        for step in range(cfg.steps):
            if step and cfg.max_minutes and time.time() - t0 > 60 * cfg.max_minutes:  # one step at least
                steps_done, stopped = step, f"max_minutes {cfg.max_minutes:g} reached after {step} of {cfg.steps} steps"
                bar.write(stopped)
                break
            while step not in pending:
                try:
                    item = queue.get(timeout=30)
                except Empty:
                    if not any(pr.is_alive() for pr in producers):
                        codes = ", ".join(str(pr.exitcode) for pr in producers)
                        raise RuntimeError(
                            f"training data producers died before step {step} (exit codes {codes})"
                        ) from None
                    continue
                if item is not None and item[0] == "error":
                    raise ValueError(f"training data producer failed: {item[1]}")
                if item is None:
                    finished += 1
                    if finished == workers:
                        raise RuntimeError(f"producers stopped before step {step}")
                    continue
                pending[item[0]] = item[1:]
            ids, mask, lab, needle = pending.pop(step)
            if step == 0:
                t_first = time.time()  # training proper starts: the data processes are up
            ids, mask, lab = (torch.from_numpy(a).to(dev) for a in (ids, mask, lab))
            loss = model(input_ids=ids, attention_mask=mask, labels=lab).loss
            losses.append(loss.item())
            if tap is not None:
                look = needle_attention_loss(
                    tap.logits(),
                    mask.bool(),
                    torch.from_numpy(needle[0]).to(dev),
                    torch.from_numpy(needle[1]).to(dev),
                    lab != -100,
                )
                looks.append(look.item())
                loss = loss + look
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            opt.step()
            sched.step()
            bar.update(1)
            bar.set_postfix(
                loss=f"{sum(losses[-50:]) / len(losses[-50:]):.3f}",
                L=int(ids.shape[1]),
                **({"look": f"{sum(looks[-50:]) / len(looks[-50:]):.3f}"} if looks else {}),
            )
            if cfg.eval_every and (step + 1) % cfg.eval_every == 0 and step + 1 < cfg.steps:
                history.append(
                    {
                        "step": step + 1,
                        "loss": sum(losses[-50:]) / len(losses[-50:]),
                        **({"needle_attention": sum(looks[-50:]) / len(looks[-50:])} if looks else {}),
                        **_try_evaluate(model, tokenizer, cfg, cfg.eval_docs),
                        "minutes": round((time.time() - t0) / 60, 2),
                    }
                )
                bar.write(json.dumps(history[-1]))
                _save(model, out, cfg, history, t0, final=False, lineage=lineage)
    finally:
        t_last = time.time()
        if tap is not None:
            tap.remove()
        stop.set()
        for pr in producers:
            pr.join(timeout=5)
            if pr.is_alive():
                pr.terminate()
        bar.close()
    final = _try_evaluate(model, tokenizer, cfg, max(cfg.eval_docs, 100)) if evaluate_at_end else {"accuracy": {}}
    if "eval_error" in final and not quiet:
        print(
            f"warning: final evaluation skipped ({final['eval_error']}); the weights are saved, "
            f"evaluate them with bench/results.py or the card's test",
            file=sys.stderr,
        )
    # steps a second after the first batch came (start-up and the final evaluation left out): what sizes a run
    rate = (steps_done - 1) / (t_last - t_first) if steps_done > 1 and t_last > t_first else None
    history.append(
        {
            "step": steps_done,
            "loss": sum(losses[-50:]) / max(1, len(losses[-50:])),
            **final,
            "minutes": round((time.time() - t0) / 60, 2),
            **({"stopped": stopped} if stopped else {}),
            **({"steps_per_second": round(rate, 3)} if rate else {}),
        }
    )
    return _save(model, out, cfg, history, t0, final=True, losses=losses, looks=looks, lineage=lineage)


def _save(
    model,
    out: Path,
    cfg: TrainConfig,
    history: list[dict],
    t0: float,
    final: bool,
    losses=None,
    looks=None,
    lineage: tuple[list[dict], list[dict]] = ([], []),
) -> dict:
    from transformers import GenerationConfig

    model.generation_config = GenerationConfig(
        decoder_start_token_id=0, eos_token_id=1, pad_token_id=0, max_new_tokens=tasks.MAX_ANSWER_TOKENS
    )
    model.save_pretrained(out, safe_serialization=True)
    dev = next(model.parameters()).device
    machine = (
        f"{platform.machine()} {os.cpu_count()} CPU cores, torch {torch.__version__} threads {torch.get_num_threads()}"
    )
    if dev.type == "cuda":
        machine = f"{torch.cuda.get_device_name(dev)} (float32), {machine}, {cfg.workers} data workers"
    card = {
        "name": cfg.name,
        "train_length": cfg.train_length,
        "tasks": taught_tasks([cfg]),
        "summary": f"T5 {cfg.encoder_layers}+{cfg.decoder_layers} layers, {cfg.num_heads} heads, d_model {cfg.d_model}"
        + (f", cosine attention s={cfg.cosine_scale:g}" if cfg.cosine_scale else "")
        + f", trained here at L_tr={cfg.train_length} tokens",
        "default": cfg.default,
        "finished": final,
        "steps_done": history[-1]["step"] if history else 0,
        "parameters": sum(p.numel() for p in model.parameters()),
        "metrics": history[-1] if history else {},
        "history": history,
        "minutes": round((time.time() - t0) / 60, 2),
        "machine": machine,
        "config": asdict(cfg),
    }
    if losses is not None:
        w = max(1, len(losses) // 50)
        card["loss_window"] = w
        card["loss_curve"] = [
            round(sum(losses[i : i + w]) / len(losses[i : i + w]), 4) for i in range(0, len(losses), w)
        ]
        if looks:  # the needle-attention loss, same windows (one value per step, like losses)
            card["needle_attention_curve"] = [
                round(sum(looks[i : i + w]) / len(looks[i : i + w]), 4) for i in range(0, len(looks), w)
            ]
    recipe, stages = lineage_entries(cfg, card, lineage)
    if len(stages) > 1:
        card["tasks"] = taught_tasks([TrainConfig.from_dict(d) for d in recipe])
        card["stages"] = stages
        card["minutes_total"] = round(sum(stage["minutes"] for stage in stages), 2)
    (out / "card.json").write_text(json.dumps(card, indent=2))
    (out / "train_config.json").write_text(json.dumps(recipe, indent=1))
    return card


def search_cosine_scale(
    cfg: TrainConfig, scales: list[float], steps: int, out: str | Path, reuse_tokenizer: str | Path | None = None
) -> dict[float, float]:
    """Pick CosScale's s by short pilot runs: mean loss of the last 20 % of ``steps`` per s.

    Cosine logits are bounded by s (plus the bias), so s sets how sharp
    attention can get at all: too small and the key cannot be singled out,
    too large and training is as brittle as unscaled dot products. A pilot of
    a few hundred steps separates the candidates cheaply.
    """
    results = {}
    for sc in scales:
        pilot = TrainConfig(
            **{
                **asdict(cfg),
                "cosine_scale": float(sc),
                "steps": steps,
                "eval_every": 0,
                "curriculum_steps": steps,
                "name": f"pilot-s{sc:g}",
            }
        )
        card = train(
            pilot, Path(out) / f"pilot-s{sc:g}", reuse_tokenizer=reuse_tokenizer, quiet=True, evaluate_at_end=False
        )
        tail = card["loss_curve"][-max(1, len(card["loss_curve"]) // 5) :]
        results[float(sc)] = round(sum(tail) / len(tail), 4)
        print(json.dumps({"cosine_scale": sc, "final_loss": results[float(sc)]}), file=sys.stderr)
    return results
