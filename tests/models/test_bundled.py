"""The bundled models: they load through core.models.load, answer at L_tr, and training works."""

from __future__ import annotations

import glob
import json
import os
import re
from pathlib import Path

import pytest
import torch

from core.data import tasks
from core.models import bundled_specs, default_model, load, memory
from core.runs import engine
from core.training import TrainConfig, check_stages, train

BUNDLED = bundled_specs()
needs_bundled = pytest.mark.skipif(not BUNDLED, reason="no bundled model in assets/models")


# A training config small enough for seconds of CPU (the tests below vary steps, lr, tasks).
TINY_TRAIN = dict(
    name="t",
    tasks={"passkey": 1.0},
    first_tasks=None,
    train_length=96,
    min_length=80,
    curriculum_steps=1,
    d_model=32,
    d_kv=8,
    d_ff=64,
    num_heads=2,
    encoder_layers=1,
    decoder_layers=1,
    eval_every=0,
    vocab_size=400,
    threads=1,
)


@needs_bundled
@pytest.mark.parametrize("spec", BUNDLED, ids=lambda s: s.name)
def test_bundled_model_loads(spec):
    loaded = load(spec.name)
    card = json.loads(loaded.spec.source and open(f"{spec.source}/card.json").read())
    assert loaded.train_length == card["train_length"] == spec.train_length
    assert loaded.model.config._attn_implementation == "aligned"
    assert loaded.cosine == bool(card["config"].get("cosine_scale"))
    if loaded.cosine:
        assert loaded.cosine_scale == card["config"]["cosine_scale"]


@needs_bundled
def test_default_model_is_bundled():
    assert default_model() in {s.name for s in BUNDLED}


def _claimed() -> list[tuple[str, str, float]]:
    """(model, task, accuracy) where the card claims >= 80 % at L_tr: what the regression guard holds them to."""
    out = []
    for spec in BUNDLED:
        card = json.loads(open(f"{spec.source}/card.json").read())
        out += [(spec.name, t, acc) for t, acc in card["metrics"].get("accuracy", {}).items() if acc >= 80]
    return out


@needs_bundled
@pytest.mark.parametrize("name,task,claimed", _claimed(), ids=lambda x: str(x))
def test_bundled_model_answers_at_train_length(name, task, claimed):
    """A regression guard on fresh seeds (never used in training: those are < 1,000,000):
    at most one answer fewer than the card's accuracy predicts (5 of 6 at 100 %, 4 of 6 at 80-90 %)."""
    loaded = load(name)
    docs = [
        tasks.make(task, loaded.tokenizer, loaded.train_length, depth=d, seed=2_000_000 + i)
        for i, d in enumerate((0.1, 0.3, 0.5, 0.7, 0.9, 0.5))
    ]
    res = engine.run_batch(loaded, docs)
    need = round(len(docs) * claimed / 100) - 1
    assert sum(bool(r.correct) for r in res) >= need, [(r.answer, r.expected) for r in res]


def test_default_model_guards_passkey():
    """The app's default model must at least do the pass key task (its tour relies on it)."""
    if not BUNDLED:
        pytest.skip("no bundled model in assets/models")
    assert (default_model(), "passkey") in {(m, t) for m, t, _ in _claimed()}


@needs_bundled
@pytest.mark.parametrize(
    "text",
    [
        "plain ascii",
        "  leading spaces",
        "Gr\u00fc\u00dfe, \u0645\u0631\u062d\u0628\u0627, \u4f60\u597d \U0001f600\n\ttabs 12345",
        "</s> <pad> literal specials",
        "\u00e9\u0301 combining \u200b zero-width",
    ],
)
def test_bundled_tokenizer_round_trips_unicode(text):
    tok = load(default_model()).tokenizer
    ids = tok(text).input_ids
    assert tok.unk_token_id not in ids
    assert tok.decode(ids, skip_special_tokens=True) == text


@pytest.mark.slow
def test_train_a_few_steps_lowers_the_loss(tmp_path):
    cfg = TrainConfig(**{**TINY_TRAIN, "steps": 60, "batch_size": 8, "lr": 3e-3, "warmup": 5})
    card = train(cfg, tmp_path / "m", quiet=True, evaluate_at_end=False)
    curve = card["loss_curve"]
    assert curve[-1] < 0.8 * curve[0], curve
    assert (tmp_path / "m" / "model.safetensors").exists() and card["train_length"] == 96
    loaded = load(str(tmp_path / "m"), device="cpu")
    assert loaded.train_length == 96 and loaded.n_layers == 1


@needs_bundled
def test_needle_maps_to_tokens_with_the_fast_tokenizer():
    loaded = load(default_model())
    doc = tasks.make("passkey", loaded.tokenizer, 2 * loaded.train_length, depth=0.4, seed=7)
    r = engine.run(loaded, doc)
    a, b = r.needle_tokens
    assert doc.expected in doc.text[r.offsets[a][0] : r.offsets[b - 1][1]]
    qa, qb = r.question_tokens
    assert doc.text[r.offsets[qa][0] : r.offsets[qb - 1][1]].strip().startswith("What is the pass key?")
    assert r.probes.profile.shape == (loaded.n_layers, r.tokens)


@pytest.mark.slow
def test_evaluation_documents_are_the_same_in_every_process():
    """The cards' accuracies compare across runs only if every process evaluates the same
    documents: two interpreters with different str-hash salts must build identical ones."""
    import subprocess
    import sys

    code = (
        "import hashlib, sys; from core.training import TrainConfig, eval_documents, get_tokenizer; "
        "cfg = TrainConfig(**{**TINY, 'tasks': {'line': 1.0}}); tok = get_tokenizer(cfg, 'assets/models/retrieval-t5'); "
        "print(hashlib.sha1(''.join(d.text for d in eval_documents(tok, cfg, 'line', 4, 200)).encode()).hexdigest())"
    )
    code = code.replace("TINY", repr(TINY_TRAIN))
    root = Path(__file__).resolve().parents[2]
    digests = {
        subprocess.run(
            [sys.executable, "-c", code],
            cwd=root,
            env={**os.environ, "PYTHONHASHSEED": salt},
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        for salt in ("1", "2", "3")
    }
    assert len(digests) == 1 and len(digests.pop()) == 40


@pytest.mark.slow
def test_training_data_do_not_depend_on_the_worker_count(tmp_path):
    """Several producer processes must hand the trainer exactly the batches one would."""
    base = {
        **TINY_TRAIN,
        "tasks": {"passkey": 0.5, "line": 0.5},
        "min_length": 60,
        "curriculum_steps": 10,
        "steps": 12,
        "batch_size": 4,
        "lr": 3e-3,
        "warmup": 2,
    }
    one = train(
        TrainConfig(**{**base, "workers": 1}), tmp_path / "one", quiet=True, evaluate_at_end=False, device="cpu"
    )
    three = train(
        TrainConfig(**{**base, "workers": 3}), tmp_path / "three", quiet=True, evaluate_at_end=False, device="cpu"
    )
    assert one["loss_curve"] == three["loss_curve"]


@pytest.mark.slow
def test_init_from_keeps_weights_and_adds_fresh_blocks(tmp_path):
    """--init-from copies every tensor the source has; blocks it lacks (a second decoder layer) start fresh."""
    from safetensors.torch import load_file

    base = {**TINY_TRAIN, "steps": 3, "batch_size": 2, "lr": 1e-3, "warmup": 1}
    train(TrainConfig(**base), tmp_path / "src", quiet=True, evaluate_at_end=False, device="cpu")
    grown = TrainConfig(**{**base, "decoder_layers": 2, "steps": 1, "lr": 0.0, "init_from": str(tmp_path / "src")})
    train(grown, tmp_path / "grown", quiet=True, evaluate_at_end=False, device="cpu")
    src, out = (
        load_file(str(tmp_path / "src" / "model.safetensors")),
        load_file(str(tmp_path / "grown" / "model.safetensors")),
    )
    assert "decoder.block.1.layer.0.SelfAttention.q.weight" in out
    for k in ("encoder.block.0.layer.0.SelfAttention.q.weight", "decoder.block.0.layer.1.EncDecAttention.k.weight"):
        assert torch.equal(src[k], out[k]), k
    narrower = TrainConfig(**{**base, "d_model": 16, "steps": 1, "init_from": str(tmp_path / "src")})
    with pytest.raises(ValueError, match="d_model 16 is below"):
        train(narrower, tmp_path / "narrower", quiet=True, evaluate_at_end=False, device="cpu")


def _first_logits(*loaded) -> list[torch.Tensor]:
    """Each model's logits for the first decoder step of one fixed input: what "computes the same" compares."""
    ids = loaded[0].tokenizer("What is the pass key? The pass key is 12345.", return_tensors="pt")
    start = torch.zeros((1, 1), dtype=torch.long)
    with torch.no_grad():
        return [m.model(**ids, decoder_input_ids=start).logits for m in loaded]


@pytest.mark.slow
def test_identity_blocks_grow_a_layer_without_changing_what_the_model_computes(tmp_path):
    """new_blocks="identity": a layer the source lacks starts with zero output projections, so the
    grown model's logits equal the source's ("fresh" ones differ); training then moves the new layer."""
    from safetensors.torch import load_file

    from core import models

    base = {**TINY_TRAIN, "steps": 3, "batch_size": 2, "lr": 1e-3, "warmup": 1}
    train(TrainConfig(**base), tmp_path / "src", quiet=True, evaluate_at_end=False, device="cpu")
    grown = {**base, "decoder_layers": TINY_TRAIN["decoder_layers"] + 1, "init_from": str(tmp_path / "src")}
    for mode in ("identity", "fresh"):
        train(
            TrainConfig(**{**grown, "new_blocks": mode, "steps": 1, "lr": 0.0}),
            tmp_path / mode,
            quiet=True,
            evaluate_at_end=False,
            device="cpu",
        )
    a, b, c = _first_logits(*(models.load(tmp_path / d) for d in ("src", "identity", "fresh")))
    assert torch.allclose(a, b, atol=1e-5)
    assert not torch.allclose(a, c, atol=1e-3)
    wo = f"decoder.block.{TINY_TRAIN['decoder_layers']}.layer.2.DenseReluDense.wo.weight"
    train(
        TrainConfig(**{**grown, "new_blocks": "identity", "steps": 2, "lr": 1e-2}),
        tmp_path / "moved",
        quiet=True,
        evaluate_at_end=False,
        device="cpu",
    )
    assert load_file(str(tmp_path / "moved" / "model.safetensors"))[wo].abs().sum() > 0
    with pytest.raises(ValueError, match="new_blocks"):
        train(
            TrainConfig(**{**grown, "new_blocks": "zero"}),
            tmp_path / "bad",
            quiet=True,
            evaluate_at_end=False,
            device="cpu",
        )
    with pytest.raises(ValueError, match="stage 2: new_blocks"):  # a recipe is refused before stage 1 trains
        check_stages([TrainConfig(**base), TrainConfig(**{**base, "new_blocks": "zero"})])


@pytest.mark.slow
def test_init_from_grows_heads_without_changing_what_the_model_computes(tmp_path):
    """More heads than the source: old heads keep their slots, new heads start with zero output
    columns, so the grown model's logits equal the source's; then training moves the new heads."""
    from safetensors.torch import load_file

    from core import models

    base = {**TINY_TRAIN, "steps": 3, "batch_size": 2, "lr": 1e-3, "warmup": 1}
    train(TrainConfig(**base), tmp_path / "src", quiet=True, evaluate_at_end=False, device="cpu")
    grown = {**base, "num_heads": 2 * TINY_TRAIN["num_heads"], "init_from": str(tmp_path / "src")}
    train(
        TrainConfig(**{**grown, "steps": 1, "lr": 0.0}),
        tmp_path / "same",
        quiet=True,
        evaluate_at_end=False,
        device="cpu",
    )
    src, same = models.load(tmp_path / "src"), models.load(tmp_path / "same")
    assert same.model.config.num_heads == 2 * src.model.config.num_heads
    a, b = _first_logits(src, same)
    assert torch.allclose(a, b, atol=1e-5)
    o = "encoder.block.0.layer.0.SelfAttention.o.weight"
    inner = src.model.config.num_heads * src.model.config.d_kv
    assert not load_file(str(tmp_path / "same" / "model.safetensors"))[o][:, inner:].any()
    train(
        TrainConfig(**{**grown, "steps": 2, "lr": 1e-2}),
        tmp_path / "moved",
        quiet=True,
        evaluate_at_end=False,
        device="cpu",
    )
    assert load_file(str(tmp_path / "moved" / "model.safetensors"))[o][:, inner:].abs().sum() > 0
    # Same tensor shapes, other head split (2 x 8 -> 4 x 4): must refuse, not load heads cut anew.
    regrouped = {
        **base,
        "num_heads": 2 * TINY_TRAIN["num_heads"],
        "d_kv": TINY_TRAIN["d_kv"] // 2,
        "init_from": str(tmp_path / "src"),
    }
    with pytest.raises(ValueError, match="d_kv"):
        train(TrainConfig(**regrouped), tmp_path / "regrouped", quiet=True, evaluate_at_end=False, device="cpu")


@pytest.mark.slow
def test_init_from_grows_width_without_changing_what_the_model_computes(tmp_path):
    """A wider d_model and d_ff than the source: the residual stream is padded with zeros (its
    writers start at zero there, the RMS norms rescaled), so the grown model's logits equal the
    source's; then training writes into the new dimensions."""
    from safetensors.torch import load_file

    from core import models

    base = {**TINY_TRAIN, "steps": 3, "batch_size": 2, "lr": 1e-3, "warmup": 1}
    train(TrainConfig(**base), tmp_path / "src", quiet=True, evaluate_at_end=False, device="cpu")
    d = TINY_TRAIN["d_model"]
    grown = {
        **base,
        "d_model": 2 * d,
        "d_ff": 3 * TINY_TRAIN["d_ff"],
        "num_heads": 2 * TINY_TRAIN["num_heads"],
        "init_from": str(tmp_path / "src"),
    }
    train(
        TrainConfig(**{**grown, "steps": 1, "lr": 0.0}),
        tmp_path / "same",
        quiet=True,
        evaluate_at_end=False,
        device="cpu",
    )
    src, same = models.load(tmp_path / "src"), models.load(tmp_path / "same")
    assert same.model.config.d_model == 2 * d
    a, b = _first_logits(src, same)
    assert torch.allclose(a, b, atol=1e-5)
    wo = "encoder.block.0.layer.1.DenseReluDense.wo.weight"
    assert not load_file(str(tmp_path / "same" / "model.safetensors"))[wo][d:].any()
    train(
        TrainConfig(**{**grown, "steps": 2, "lr": 1e-2}),
        tmp_path / "moved",
        quiet=True,
        evaluate_at_end=False,
        device="cpu",
    )
    moved = load_file(str(tmp_path / "moved" / "model.safetensors"))
    assert moved[wo][d:].abs().sum() > 0 and moved["shared.weight"][:, d:].abs().sum() > 0


@pytest.mark.slow
def test_staged_config_trains_each_stage_from_the_previous_one(tmp_path):
    """A list in --config is a recipe: stage 2 starts from stage 1's weights (its own init_from ignored),
    may grow the model, and the final card sums up every stage."""
    from safetensors.torch import load_file

    from core.training import load_stages, stage_dir, train_stages

    base = {**TINY_TRAIN, "steps": 3, "batch_size": 2, "lr": 1e-3, "warmup": 1}
    stages = [
        base,
        {
            **base,
            "decoder_layers": 2,
            "lr": 0.0,
            "steps": 1,
            "init_from": "ignored/elsewhere",
            "tasks": {"line": 0.5, "code": 0.5},
        },
    ]
    (tmp_path / "recipe.json").write_text(json.dumps(stages))
    train_stages(
        load_stages(tmp_path / "recipe.json"),
        tmp_path / "m",
        quiet=True,
        device="cpu",
        evaluate_at_end=False,
        stages_dir=tmp_path / "runs",
    )
    first, final = (
        load_file(str(stage_dir(tmp_path / "m", 0, tmp_path / "runs") / "model.safetensors")),
        load_file(str(tmp_path / "m" / "model.safetensors")),
    )
    k = "encoder.block.0.layer.0.SelfAttention.q.weight"
    assert torch.equal(first[k], final[k])  # lr 0 in stage 2: stage 1's weights came through
    assert "decoder.block.1.layer.0.SelfAttention.q.weight" in final
    card = json.loads((tmp_path / "m" / "card.json").read_text())
    assert [s["layers"] for s in card["stages"]] == ["1+1", "1+2"]
    assert card["tasks"] == ["passkey", "line", "code"]  # every stage's tasks, not only the last one's
    assert card["stages"][1]["init_from"] == "previous stage"
    assert card["minutes_total"] == pytest.approx(sum(s["minutes"] for s in card["stages"]), abs=0.02)


@pytest.mark.slow
def test_a_continued_model_keeps_its_sources_recipe_and_retrains_from_it(tmp_path):
    """Continuing a model that train wrote (init_from) puts the source's stages in front: the card
    counts every stage and minute, and out/train_config.json alone retrains the same weights."""
    from safetensors.torch import load_file

    from core.training import load_stages, train_stages

    base = {**TINY_TRAIN, "steps": 3, "batch_size": 2, "lr": 1e-3, "warmup": 1}
    train_stages([TrainConfig(**base)], tmp_path / "src", quiet=True, device="cpu", evaluate_at_end=False)
    more = [
        TrainConfig(
            **{
                **base,
                "init_from": str(tmp_path / "src"),
                "decoder_layers": 2,
                "new_blocks": "identity",
                "tasks": {"line": 1.0},
                "seed": 7,
            }
        ),
        TrainConfig(**{**base, "decoder_layers": 2, "steps": 2, "seed": 8}),
    ]
    card = train_stages(
        more,
        tmp_path / "cont",
        reuse_tokenizer=tmp_path / "src",
        quiet=True,
        device="cpu",
        evaluate_at_end=False,
        stages_dir=tmp_path / "runs",
    )
    assert [s["layers"] for s in card["stages"]] == ["1+1", "1+2", "1+2"]
    assert [s["init_from"] for s in card["stages"][1:]] == ["previous stage", "previous stage"]
    assert card["tasks"] == ["passkey", "line"]  # the source taught pass key
    assert card["minutes_total"] == pytest.approx(sum(s["minutes"] for s in card["stages"]), abs=0.02)
    recipe = load_stages(tmp_path / "cont" / "train_config.json")
    assert [c.seed for c in recipe] == [0, 7, 8] and all(c.init_from is None for c in recipe)
    train_stages(
        recipe, tmp_path / "again", quiet=True, device="cpu", evaluate_at_end=False, stages_dir=tmp_path / "runs2"
    )
    a, b = (
        load_file(str(tmp_path / "cont" / "model.safetensors")),
        load_file(str(tmp_path / "again" / "model.safetensors")),
    )
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow
def test_every_folder_train_leaves_keeps_its_lineage(tmp_path, monkeypatch):
    """A stage of a staged run, or a run's halfway save, is a model one may continue (the line
    model was continued from such folders); each holds the recipe and stages that made it, so the
    continuation's card counts them and its train_config.json retrains it."""
    import core.training.loop
    from core.training import load_stages, source_recipe, train_stages

    halfway = []  # what a mid-run save left on disk: the lineage must be there before the run ends
    real_save = core.training.loop._save

    def save_and_look(model, out, *args, final, **kw):
        card = real_save(model, out, *args, final=final, **kw)
        if not final:
            halfway.append(json.loads((out / "train_config.json").read_text()))
        return card

    monkeypatch.setattr(core.training.loop, "_save", save_and_look)
    base = {**TINY_TRAIN, "steps": 3, "batch_size": 2, "lr": 1e-3, "warmup": 1, "train_length": 192, "min_length": 180}
    tok = os.path.join(_ROOT, "assets", "models", "retrieval-t5")  # the halfway evaluation needs room for a pass key
    train_stages(
        [TrainConfig(**base)], tmp_path / "src", reuse_tokenizer=tok, quiet=True, device="cpu", evaluate_at_end=False
    )
    two = [
        TrainConfig(**{**base, "init_from": str(tmp_path / "src"), "seed": 5}),
        TrainConfig(**{**base, "seed": 6, "steps": 4, "eval_every": 2, "eval_docs": 1}),
    ]
    train_stages(
        two,
        tmp_path / "two",
        reuse_tokenizer=tok,
        quiet=True,
        device="cpu",
        evaluate_at_end=False,
        stages_dir=tmp_path / "runs",
    )
    recipe, stages = source_recipe(tmp_path / "runs" / "two.stage0")  # an intermediate stage
    assert [d["seed"] for d in recipe] == [0, 5] and len(stages) == 2
    card = train_stages(
        [TrainConfig(**{**base, "init_from": str(tmp_path / "runs" / "two.stage0"), "seed": 9})],
        tmp_path / "three",
        reuse_tokenizer=tok,
        quiet=True,
        device="cpu",
        evaluate_at_end=False,
    )
    assert [s["steps"] for s in card["stages"]] == [3, 3, 3]
    assert [c.seed for c in load_stages(tmp_path / "three" / "train_config.json")] == [0, 5, 9]
    assert [[d["seed"] for d in r] for r in halfway] == [[0, 5, 6]]  # stage 2's save at step 2 of 4


_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RECIPES = sorted(glob.glob(f"{_ROOT}/assets/*/*/train_config.json") + glob.glob(f"{_ROOT}/recipes/*.json"))


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: os.path.relpath(p, _ROOT))
def test_shipped_recipes_chain(path, monkeypatch):
    """Every recipe we ship (a bundled model's train_config.json, recipes/*.json) is one that can run:
    stages keep d_model/d_kv/d_ff and only grow heads and layers, from an init_from that exists."""
    from core.training import load_stages

    monkeypatch.chdir(_ROOT)  # recipes name init_from relative to the repository, as the README runs them

    cfgs = load_stages(path)
    check_stages(cfgs)
    if path.endswith("train_config.json"):  # its last stage made the weights beside it
        c = json.loads((Path(path).parent / "config.json").read_text())
        if c.get("model_type") == "modernbert":  # a rotary encoder (core.training.mlm): ModernBERT's names
            assert (c["num_attention_heads"], c["num_hidden_layers"]) == (cfgs[-1].num_heads, cfgs[-1].encoder_layers)
        else:
            assert (c["num_heads"], c["num_layers"], c["num_decoder_layers"]) == (
                cfgs[-1].num_heads,
                cfgs[-1].encoder_layers,
                cfgs[-1].decoder_layers,
            )


def test_a_recipe_that_cannot_chain_is_refused_before_it_trains(tmp_path):
    from core.cli import main as cli_main

    base = {**TINY_TRAIN, "steps": 1, "batch_size": 2}
    with pytest.raises(ValueError, match="d_kv"):
        check_stages([TrainConfig(**base), TrainConfig(**{**base, "num_heads": 4, "d_kv": 4})])
    with pytest.raises(ValueError, match="num_heads .* only grow"):
        check_stages([TrainConfig(**{**base, "num_heads": 4}), TrainConfig(**base)])
    with pytest.raises(ValueError, match="init_from"):
        check_stages([TrainConfig(**{**base, "init_from": str(tmp_path / "nowhere")})])
    check_stages([TrainConfig(**base), TrainConfig(**{**base, "num_heads": 4, "decoder_layers": 2})])  # growth is fine
    (tmp_path / "bad.json").write_text(json.dumps([base, {**base, "d_model": 16}]))
    assert (
        cli_main(
            [
                "train",
                "--config",
                str(tmp_path / "bad.json"),
                "--out",
                str(tmp_path / "m"),
                "--stages-dir",
                str(tmp_path / "runs"),
            ]
        )
        == 2
    )
    assert not (tmp_path / "m").exists() and not (tmp_path / "runs").exists()  # nothing trained


def test_staged_config_refuses_an_empty_list(tmp_path):
    from core.cli import main as cli_main

    (tmp_path / "empty.json").write_text("[]")
    assert cli_main(["train", "--config", str(tmp_path / "empty.json"), "--out", str(tmp_path / "m")]) == 2


@needs_bundled
def test_task_options_reach_the_training_documents(tmp_path):
    """task_options are passed to tasks.make for training and evaluation; a bad one fails before training."""
    import random

    from core.training import sample_document

    cfg = TrainConfig(**{**TINY_TRAIN, "tasks": {"line": 1.0}, "task_options": {"line": {"labels": "classic"}}})
    compact = TrainConfig(**{**TINY_TRAIN, "tasks": {"line": 1.0}})
    tok = load(default_model()).tokenizer
    classic_adj, _ = tasks.LINE_LABELS["classic"]
    compact_adj, _ = tasks.LINE_LABELS["compact"]
    only_classic = set(classic_adj) - set(compact_adj)

    def words(doc):
        return {w.split("-")[0] for w in re.findall(r"^line (\S+):", doc.text, flags=re.M)}

    got = set().union(*(words(sample_document(cfg, tok, random.Random(s), 200)) for s in range(6)))
    assert got & only_classic
    got = set().union(*(words(sample_document(compact, tok, random.Random(s), 200)) for s in range(6)))
    assert got <= set(compact_adj)
    bad = TrainConfig(**{**TINY_TRAIN, "steps": 1, "task_options": {"line": {"labels": "emoji"}}})
    with pytest.raises(ValueError, match="task_options.*labels must be one of"):
        train(bad, tmp_path / "bad", quiet=True, evaluate_at_end=False, device="cpu")


@needs_bundled
def test_last_needle_puts_the_asked_line_right_before_the_question(tmp_path):
    """last_needle {"line": p}: with p = 1 every line document asks its last line; a knob for
    another task leaves the line documents exactly as before (old recipes replay)."""
    import random

    from core.training import sample_document

    tok = load(default_model()).tokenizer
    base = {**TINY_TRAIN, "tasks": {"line": 1.0}}

    def places(cfg):
        out = []
        for s in range(8):
            doc = sample_document(cfg, tok, random.Random(s), 220)
            lines = re.findall(r"^line (\S+): REGISTER_CONTENT is (\d+)$", doc.text, flags=re.M)
            out.append(([n for _, n in lines].index(doc.expected), len(lines), doc.text))
        return out

    plain = places(TrainConfig(**base))
    last = places(TrainConfig(**{**base, "last_needle": {"line": 1.0}}))
    other = places(TrainConfig(**{**base, "last_needle": {"passkey": 1.0}}))
    assert all(i == n - 1 for i, n, _ in last)
    assert sum(i != n - 1 for i, n, _ in plain) >= 4  # a uniform depth rarely picks the last line
    assert [t for *_, t in other] == [t for *_, t in plain]
    with pytest.raises(ValueError, match="last_needle"):
        train(
            TrainConfig(**{**TINY_TRAIN, "steps": 1, "last_needle": {"line": 1.5}}),
            tmp_path / "bad",
            quiet=True,
            evaluate_at_end=False,
            device="cpu",
        )


@needs_bundled
def test_compact_line_labels_are_a_few_tokens_of_the_bundled_tokenizer():
    """Why the compact list exists: each label costs 3-4 tokens (the classic list ~8)."""
    tok = load(default_model()).tokenizer

    def cost(adj, nouns):
        return [len(tok(f" {a}-{n}", add_special_tokens=False).input_ids) for a in adj for n in nouns]

    compact = cost(*tasks.LINE_LABELS["compact"])
    classic = cost(*tasks.LINE_LABELS["classic"])
    assert max(compact) <= 4
    assert sum(classic) / len(classic) > 1.5 * sum(compact) / len(compact)


@pytest.mark.slow
def test_a_failing_data_producer_stops_training_with_its_error(tmp_path):
    """A producer that raises must not leave the trainer waiting on an empty queue forever.
    Topic documents cannot fit in 20 tokens (nor in the 4x the sampler grows to)."""
    cfg = TrainConfig(
        **{**TINY_TRAIN, "steps": 3, "batch_size": 2, "tasks": {"topic": 1.0}, "train_length": 20, "min_length": 20}
    )
    with pytest.raises(ValueError, match="producer failed: ValueError: "):
        train(cfg, tmp_path / "b", quiet=True, evaluate_at_end=False, device="cpu")


@needs_bundled
def test_line_answer_label_names_the_line_then_the_number():
    """line_answer="label": the target is the record's own line minus its middle, scored right, and fits
    in what the engine generates; other tasks keep the bare answer."""
    tok = load(default_model()).tokenizer
    doc = tasks.make("line", tok, 256, seed=3)
    labelled = tasks.target(doc, "label")
    assert labelled == f"line {doc.meta['line_index']}: {doc.expected}"
    assert labelled in doc.text.replace(": REGISTER_CONTENT is ", ": ")
    assert tasks.score("line", labelled, doc.expected).correct
    assert len(tok(labelled).input_ids) <= engine.Pass().max_new_tokens
    assert tasks.target(doc) == doc.expected
    key = tasks.make("passkey", tok, 256, seed=3)
    assert tasks.target(key, "label") == key.expected
    with pytest.raises(ValueError, match="line_answer"):
        tasks.target(doc, "essay")


def _children(pid: int) -> list[int]:
    kids = []
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                stat = open(f"/proc/{p}/stat").read()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                kids.append(int(p))
    return kids


def _alive(pids: list[int]) -> list[int]:
    return [k for k in pids if os.path.exists(f"/proc/{k}") and open(f"/proc/{k}/stat").read().split()[2] != "Z"]


def _trainer_with_producers(tmp_path, cfg: dict, steps_done: int = 0):
    """``python -m core train`` on ``cfg`` in a subprocess; returns ``(process, producer pids, stderr path)`` once
    its producers are up and, with ``steps_done``, once it has trained that many steps (so the producers are past
    their start: imports under load can take 30 s, and are not what these tests bound)."""
    import subprocess
    import sys
    import time

    (tmp_path / "c.json").write_text(json.dumps(cfg))
    log = tmp_path / "train.log"
    with open(log, "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "core", "train", "--config", str(tmp_path / "c.json"), "--out", str(tmp_path / "m")],
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    producers, deadline = [], time.time() + 300
    while time.time() < deadline and not (tmp_path / "m" / "tokenizer.json").exists() and proc.poll() is None:
        time.sleep(0.2)
    while time.time() < deadline and not producers and proc.poll() is None:  # the spawned producer (the resource
        producers = [k for k in _children(proc.pid) if "spawn_main" in open(f"/proc/{k}/cmdline").read()]  # tracker
        time.sleep(0.2)  # is another child)
    while (
        steps_done
        and time.time() < deadline
        and proc.poll() is None
        and f" {steps_done}/{cfg['steps']}" not in log.read_text(errors="replace").replace("|", " ")
    ):
        time.sleep(0.1)
    return proc, producers, log


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="needs /proc to find the producer")
@pytest.mark.parametrize("batch_size", [2, 128], ids=["small-batches", "batches-larger-than-a-pipe"])
@pytest.mark.slow
def test_producer_exits_when_its_trainer_is_killed(tmp_path, batch_size):
    """SIGKILL on the trainer (no cleanup runs) must not leave its data producer running.

    With batches larger than a pipe's buffer (64 KiB), the queue's feeder thread is stuck
    writing when the trainer stops reading; a producer that returns would then hang at exit
    joining that thread (seen: an orphan blocked in a pipe write for 20+ minutes).

    The producer ends with its trainer by design (``PR_SET_PDEATHSIG``, :func:`core.training.data.die_with`), so
    the bound is the kernel's, not the producer's next look at its parent: it is killed once the trainer is
    killed. The kill comes after the trainer's first step, when the producer is past its imports (which took
    17-32 s at load 7 on this machine, and 30 s+ at load 12-15: the flake of issue 47, point 6)."""
    import signal
    import time

    cfg = {**TINY_TRAIN, "steps": 100000, "batch_size": batch_size, "eval_every": 0}
    proc, producers, log = _trainer_with_producers(tmp_path, cfg, steps_done=1)
    try:
        assert producers, "no producer process appeared: " + log.read_text(errors="replace")[-1500:]
        assert proc.poll() is None, log.read_text(errors="replace")[-1500:]
        proc.send_signal(signal.SIGSTOP)  # the trainer stops taking batches ...
        time.sleep(3)  # ... so the queue fills and the producer waits in put()
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    deadline = time.time() + 10
    while time.time() < deadline and _alive(producers):
        time.sleep(0.1)
    alive = _alive(producers)
    for k in alive:
        os.kill(k, 9)
    assert not alive, "the producer outlived its trainer"


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="needs /proc to find the producer")
@pytest.mark.slow
def test_producer_making_a_batch_dies_with_its_trainer_at_once(tmp_path):
    """A producer busy making a large batch when its trainer is killed used to finish that batch first (it looked
    at its parent only between batches: 10-30 s here); now it ends with the trainer (within 5 s, the kernel's
    SIGKILL and /proc's reaping, however busy the machine)."""
    import signal
    import time

    cfg = {**TINY_TRAIN, "steps": 100000, "batch_size": 2048, "eval_every": 0}
    proc, producers, log = _trainer_with_producers(tmp_path, cfg, steps_done=1)
    try:
        assert producers and proc.poll() is None, log.read_text(errors="replace")[-1500:]
    finally:
        proc.send_signal(signal.SIGKILL)  # the producer is making the batch of step 1 or 2 now
        proc.wait()
    t0 = time.time()
    while time.time() < t0 + 5 and _alive(producers):
        time.sleep(0.05)
    alive = _alive(producers)
    for k in alive:
        os.kill(k, 9)
    assert not alive, f"the producer outlived its trainer by {time.time() - t0:.1f} s"


@pytest.mark.slow
def test_die_with_is_the_kernel_s_on_linux():
    """The mechanism itself: in a child, ``die_with`` reports PR_SET_PDEATHSIG on Linux (a watchdog elsewhere), and
    a child whose parent is already gone (the race before the call) exits at once."""
    import subprocess
    import sys

    code = "import os, sys; from core.training.data import die_with; print(die_with(os.getppid()))"
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
    )
    assert out.returncode == 0, out.stderr[-1500:]
    assert out.stdout.strip() == ("pdeathsig" if sys.platform.startswith("linux") else "watchdog")
    gone = subprocess.run(
        [sys.executable, "-c", "from core.training.data import die_with; die_with(-1); print('ran on')"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
    )
    assert gone.returncode == 0 and "ran on" not in gone.stdout


@pytest.mark.slow
def test_a_refused_evaluation_does_not_lose_the_training(tmp_path, monkeypatch):
    """When the engine refuses to evaluate (here: no free memory), training goes on, the weights
    are saved, and the card's history says why the step has no accuracy."""

    monkeypatch.setattr(memory, "free_bytes", lambda device: 0)
    cfg = TrainConfig(
        **{
            **TINY_TRAIN,
            "train_length": 200,
            "min_length": 160,
            "steps": 4,
            "batch_size": 2,
            "eval_every": 2,
            "eval_docs": 2,
            "warmup": 1,
        }
    )
    card = train(cfg, tmp_path / "m", quiet=True, device="cpu")
    assert (tmp_path / "m" / "model.safetensors").exists()
    assert [h["step"] for h in card["history"]] == [2, 4]
    assert all(h["accuracy"] == {} and "tokens" in h["eval_error"] for h in card["history"])


@needs_bundled
def test_line_misses_sorts_misses_by_what_the_labels_share(capsys):
    """research/line_misses.py: the relation of two labels, and a small run that prints both tables."""
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "research" / "line_misses.py"
    spec = importlib.util.spec_from_file_location("line_misses", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    tok = load(default_model()).tokenizer

    def pieces(word):
        return {t for t in tok.tokenize(word) if t != "-"}

    assert mod.relation("wild-queue", "long-queue", pieces) == "noun"
    assert mod.relation("red-seal", "red-tiger", pieces) == "adjective"
    assert mod.relation("new-map", "kind-path", pieces) == "a noun piece"  # -ma p / -p ath
    assert mod.relation("bold-river", "empty-sea", pieces) == "nothing"
    assert mod.relation("quiet-moon-river", "calm-moon", pieces) == "noun"  # a lengthened label keeps its pair
    assert mod.main(["--samples", "3"]) == 0
    out = capsys.readouterr().out
    assert "3 documents of 256 tokens" in out and "| noun |" in out and "| right |" in out
    lengthened = re.search(r"such labels among the other lines: (\d+) of (\d+)", out)
    assert lengthened and 0 < int(lengthened.group(1)) < int(lengthened.group(2)) == 3 * 7  # 8 lines at L_tr


# --------------------------------------------------------------------------- attention supervision


@needs_bundled
def test_needle_token_mask_marks_exactly_the_needle():
    from core.training import needle_token_mask

    tok = load(default_model()).tokenizer
    docs = [
        tasks.make(t, tok, 200, depth=0.3 + 0.2 * i, seed=11 + i) for i, t in enumerate(("line", "passkey", "code"))
    ]
    enc = tok([d.text for d in docs], padding=True, return_tensors="pt", return_offsets_mapping=True)
    mask = needle_token_mask(enc.offset_mapping.numpy(), [d.needle_span for d in docs])
    for i, d in enumerate(docs):
        picked = enc.input_ids[i][torch.from_numpy(mask[i])]
        assert tok.decode(picked).strip() == d.text[slice(*d.needle_span)].strip()
        assert not mask[i][enc.attention_mask[i] == 0].any()


@pytest.mark.parametrize("cosine", [None, 24.0], ids=["dot", "cosine"])
def test_cross_attention_tap_gives_the_probabilities_the_model_uses(tmp_path, cosine):
    """softmax(tap logits) @ v must equal what each cross-attention hands its output projection."""
    from core.training import CrossAttentionTap
    from tests.conftest import build_tiny_t5

    loaded = load(str(build_tiny_t5(tmp_path / "m", decoder_layers=2, cosine=cosine)), device="cpu")
    model = loaded.model
    seen: dict[str, torch.Tensor] = {}
    hooks = []
    for i, block in enumerate(model.decoder.block):
        att = block.layer[1].EncDecAttention
        hooks.append(att.v.register_forward_hook(lambda m, a, out, i=i: seen.__setitem__(f"v{i}", out)))
        hooks.append(att.o.register_forward_hook(lambda m, a, out, i=i: seen.__setitem__(f"o{i}", a[0])))
    tap = CrossAttentionTap(model)
    enc = loaded.tokenizer(["a short document, then a question?", "another one"], padding=True, return_tensors="pt")
    labels = loaded.tokenizer(["12345", "7"], padding=True, return_tensors="pt").input_ids
    with torch.no_grad():
        model(input_ids=enc.input_ids, attention_mask=enc.attention_mask, labels=labels)
    logits = tap.logits()
    tap.remove()
    for h in hooks:
        h.remove()
    assert len(logits) == 2
    heads, d_kv = model.config.num_heads, model.config.d_kv
    for i, lg in enumerate(logits):
        p = lg.masked_fill(enc.attention_mask[:, None, None, :] == 0, float("-inf")).softmax(-1)
        v = seen[f"v{i}"].view(2, -1, heads, d_kv).transpose(1, 2)
        mine = (p @ v).transpose(1, 2).reshape(2, labels.shape[1], heads * d_kv)
        assert torch.allclose(mine, seen[f"o{i}"], atol=1e-5), (i, (mine - seen[f"o{i}"]).abs().max())


def test_needle_attention_loss_asks_the_lookup_heads_only():
    from core.training import needle_attention_loss

    B, S, T = 2, 6, 3
    needle = torch.zeros(B, S, dtype=torch.bool)
    needle[:, 2:4] = True
    enc_mask = torch.ones(B, S, dtype=torch.bool)
    answer = torch.ones(B, T, dtype=torch.bool)
    weight = torch.ones(B)

    def head(on_needle: float) -> torch.Tensor:
        """Logits whose softmax gives the needle (two tokens) this share."""
        lg = torch.zeros(B, 1, T, S)
        lg[..., 2:4] = torch.log(torch.tensor(on_needle / (1 - on_needle) * 4 / 2))
        return lg

    sharp, soft, elsewhere = head(0.9), head(0.6), head(0.05)
    loss = needle_attention_loss([torch.cat([sharp, soft], 1), elsewhere], enc_mask, needle, weight, answer)
    # the two lookup heads (shares 0.9 and 0.6) count; the one that looks elsewhere does not
    assert loss.item() == pytest.approx(
        -(torch.log(torch.tensor(0.9)) + torch.log(torch.tensor(0.6))).item() / 2, rel=1e-4
    )
    # documents of weight 0 (other tasks) and padding of the encoder change nothing
    pad = enc_mask.clone()
    pad[:, 5] = False
    lg = torch.cat([sharp, soft], 1).clone()
    lg[..., 5] = 50.0  # all mass on a padded token: ignored
    assert needle_attention_loss([lg], pad, needle, weight, answer).item() < loss.item() + 0.2
    assert needle_attention_loss([elsewhere], enc_mask, needle, torch.zeros(B), answer).item() == 0.0
    # no lookup head yet: the best head is asked
    assert needle_attention_loss([elsewhere], enc_mask, needle, weight, answer).item() == pytest.approx(
        -torch.log(torch.tensor(0.05)).item(), rel=1e-4
    )


@pytest.mark.slow
def test_needle_attention_training_sharpens_the_lookup(tmp_path):
    """Training with the supervision raises the needle's share of cross-attention over the same run without it."""
    from core.training import CrossAttentionTap, needle_log_shares, needle_token_mask

    base = {**TINY_TRAIN, "steps": 40, "batch_size": 8, "lr": 3e-3, "warmup": 5, "seed": 3}
    shares = {}
    for name, sup in (("plain", {}), ("supervised", {"passkey": 1.0})):
        train(
            TrainConfig(**{**base, "needle_attention": sup}),
            tmp_path / name,
            quiet=True,
            evaluate_at_end=False,
            device="cpu",
        )
        loaded = load(str(tmp_path / name), device="cpu")
        docs = [tasks.make("passkey", loaded.tokenizer, 160, depth=0.1 * i, seed=10**6 + i) for i in range(8)]
        enc = loaded.tokenizer([d.text for d in docs], padding=True, return_tensors="pt", return_offsets_mapping=True)
        needle = torch.from_numpy(needle_token_mask(enc.offset_mapping.numpy(), [d.needle_span for d in docs]))
        labels = loaded.tokenizer([d.expected for d in docs], padding=True, return_tensors="pt").input_ids
        tap = CrossAttentionTap(loaded.model)
        with torch.no_grad():
            loaded.model(input_ids=enc.input_ids, attention_mask=enc.attention_mask, labels=labels)
        share = needle_log_shares(tap.logits()[:1], enc.attention_mask.bool(), needle).exp()
        shares[name] = share[:, :, 0].max(1).values.mean().item()
    assert shares["supervised"] > shares["plain"] + 0.2, shares


def test_needle_attention_refuses_unknown_tasks(tmp_path):
    cfg = TrainConfig(**{**TINY_TRAIN, "steps": 1, "needle_attention": {"lines": 0.5}})
    with pytest.raises(ValueError, match="needle_attention"):
        train(cfg, tmp_path / "m", quiet=True, evaluate_at_end=False, device="cpu")
