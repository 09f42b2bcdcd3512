"""core.runs.apply on a model the user holds: same answers as the CLI, exact restore, refusals, settings files.

transformers 5.23 removed the ``text2text-generation`` pipeline (its
REMOVED_TASKS says: use ``text-generation``). The ``text-generation``
pipeline still drives an encoder-decoder model's ``generate``, but its text
post-processing assumes a decoder-only model (it cuts the prompt's length off
the output), so we ask it for token ids (``return_tensors=True``) and decode
them, which is exactly what ``text2text-generation`` did.
"""

from __future__ import annotations

import json
import threading

import pytest
import torch
from transformers import ByT5Tokenizer, T5Config, T5ForConditionalGeneration, pipeline

from core.cli import main as cli
from core.data.tasks import MAX_ANSWER_TOKENS
from core.errors import UserError
from core.kinds import is_aligned
from core.mechanics import attention
from core.mechanics.attention import ATTN_NAME, attention_modules
from core.runs import apply as ap
from core.runs import temperature
from core.runs.settings import DocumentRequest, Settings
from core.values.choice import Choice
from core.values.schedule import RowTau, Schedule

CONTEXT = (
    "The harbour town kept its records in a stone tower. Every spring the keepers counted the boats, "
    "wrote the number on a slate and carried it up the stairs. One year the count was 4182 boats."
)
QUESTION = "How many boats were counted?"
TEXT = CONTEXT + "\n" + QUESTION  # what from_text(needle="") builds
GEN = dict(max_new_tokens=MAX_ANSWER_TOKENS, do_sample=False, num_beams=1)  # what core.runs.engine.run generates with


def build_chatty_t5(folder, seed: int = 0, train_length: int = 64):
    """A tiny random T5 whose greedy answers vary with the input and with tau.

    The conftest model ties its head to the embeddings and answers pad tokens
    only; here the head is untied and limited to printable bytes, and the
    decoder listens hard to the encoder (so an encoder tau shows in the text).
    """
    torch.manual_seed(seed)
    cfg = T5Config(
        vocab_size=384,
        d_model=64,
        d_kv=16,
        d_ff=128,
        num_layers=2,
        num_decoder_layers=1,
        num_heads=4,
        relative_attention_num_buckets=32,
        relative_attention_max_distance=128,
        dropout_rate=0.0,
        decoder_start_token_id=0,
        pad_token_id=0,
        eos_token_id=1,
        tie_word_embeddings=False,
    )
    model = T5ForConditionalGeneration(cfg)
    with torch.no_grad():
        for blk in model.encoder.block:
            blk.layer[0].SelfAttention.q.weight.mul_(8.0)
        model.encoder.block[0].layer[0].SelfAttention.relative_attention_bias.weight.normal_(0, 2.0)
        model.lm_head.weight[:35] = 0  # specials and control bytes never win
        model.lm_head.weight[130:] = 0
        for blk in model.decoder.block:
            blk.layer[1].EncDecAttention.o.weight.mul_(10.0)
            blk.layer[1].EncDecAttention.q.weight.mul_(8.0)
    model.save_pretrained(folder, safe_serialization=True)
    ByT5Tokenizer().save_pretrained(folder)
    (folder / "card.json").write_text(json.dumps({"train_length": train_length}))
    return folder


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def chatty_dir(tmp_path_factory):
    return build_chatty_t5(tmp_path_factory.mktemp("chatty-t5"))


@pytest.fixture()
def user_model(chatty_dir):
    """The user's own copy, loaded the plain transformers way (sdpa attention)."""
    return T5ForConditionalGeneration.from_pretrained(str(chatty_dir)).eval()


@pytest.fixture(scope="module")
def tok():
    return ByT5Tokenizer()


def _answer(model, tok, text=TEXT) -> str:
    with torch.no_grad():
        out = model.generate(**tok([text], return_tensors="pt"), **GEN)
    return tok.decode(out[0], skip_special_tokens=True).strip()


def _impls(model) -> list:
    return [c.__dict__.get("_attn_implementation_internal") for c in attention.configs(model)]


def _state(model) -> dict:
    return {name: sorted(m.__dict__) for name, m in model.named_modules()}


def _cli_json(capsys, argv) -> dict:
    capsys.readouterr()
    assert cli(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_pipeline_inside_apply_equals_cli_and_restores_exactly(chatty_dir, user_model, tok, tmp_path, capsys):
    text_file = tmp_path / "doc.txt"
    text_file.write_text(CONTEXT, encoding="utf-8")
    got_cli = _cli_json(
        capsys,
        [
            "run",
            "--tau",
            "0.7",
            "--json",
            "--model",
            str(chatty_dir),
            "--task",
            "text",
            "--text-file",
            str(text_file),
            "--needle",
            "",
            "--question",
            QUESTION,
        ],
    )
    assert got_cli["tau"] == 0.7 and got_cli["method"] == "fixed"

    impls_before, state_before = _impls(user_model), _state(user_model)
    assert user_model.config._attn_implementation == "sdpa"
    ids = tok([TEXT], return_tensors="pt")
    with torch.no_grad():
        logits_before = user_model(**ids, decoder_input_ids=torch.zeros(1, 1, dtype=torch.long)).logits
    plain = _answer(user_model, tok)

    with ap.apply(user_model, tau=0.7) as st:
        assert st.tau == Schedule.of(0.7) and st.targets == ("encoder",)
        assert user_model.config._attn_implementation == ATTN_NAME
        assert user_model.encoder.config._attn_implementation == ATTN_NAME
        assert user_model.decoder.config._attn_implementation == ATTN_NAME
        pipe = pipeline("text-generation", model=user_model, tokenizer=tok, device="cpu")  # a GPU box would move it
        out = pipe(TEXT, return_tensors=True, add_special_tokens=True, **GEN)
        via_pipeline = tok.decode(out[0]["generated_token_ids"], skip_special_tokens=True).strip()
        via_generate = _answer(user_model, tok)

    assert via_pipeline == got_cli["answer"], (via_pipeline, got_cli["answer"])
    assert via_generate == got_cli["answer"]
    assert via_generate != plain, "tau 0.7 should change this model's answer (else the test proves nothing)"

    # restored exactly: every config's implementation, no attribute of ours, same numbers
    assert _impls(user_model) == impls_before
    assert _state(user_model) == state_before
    with torch.no_grad():
        logits_after = user_model(**ids, decoder_input_ids=torch.zeros(1, 1, dtype=torch.long)).logits
    assert torch.equal(logits_before, logits_after)
    assert _answer(user_model, tok) == plain
    fresh = T5ForConditionalGeneration.from_pretrained(str(chatty_dir)).eval()
    assert _answer(fresh, tok) == plain


def test_restores_after_an_error_and_nests(user_model, tok):
    before = _impls(user_model)
    with pytest.raises(RuntimeError):
        with ap.apply(user_model, tau=0.5):
            raise RuntimeError("boom")
    assert _impls(user_model) == before
    with ap.apply(user_model, tau=0.7):
        inner_ref = _answer(user_model, tok)
        with ap.apply(user_model, tau=1.0):
            assert user_model.config._attn_implementation == ATTN_NAME
        assert user_model.config._attn_implementation == ATTN_NAME  # the inner exit restored "aligned"
        assert _answer(user_model, tok) == inner_ref  # and the outer tau is back in force
    assert _impls(user_model) == before


def test_schedules_per_layer_and_head(user_model, tok):
    with ap.apply(user_model, tau=0.7):
        one = _answer(user_model, tok)
    with ap.apply(user_model, schedule=[0.7, 0.7]) as st:
        assert st.tau == Schedule.of([0.7, 0.7])
        assert _answer(user_model, tok) == one
    with ap.apply(user_model, schedule=[[0.7] * 4, [0.7] * 4]):
        assert _answer(user_model, tok) == one
    for bad in ([0.7, 0.7, 0.7], 0.0, [[0.7] * 3] * 2):
        with pytest.raises(UserError, match="2 layers x 4 heads"):
            with ap.apply(user_model, schedule=bad):
                pass
    with pytest.raises(UserError, match="either tau"):
        with ap.apply(user_model, tau=0.7, schedule=[0.7, 0.7]):
            pass
    assert user_model.config._attn_implementation == "sdpa"


def test_a_row_schedule_on_a_users_model(user_model, tok):
    """Llama 4's tau per query row reaches a model the user holds, as a RowTau or as its JSON dict, and it is
    what core.mechanics.attention computes under attention_call with the same schedule."""
    from core.mechanics.attention import attention_call

    rows = RowTau(floor_scale=8, attn_scale=2.0)  # a strong scale: rows past 8 sharpen a lot
    ids = tok(TEXT, return_tensors="pt").input_ids
    enc = user_model.get_encoder()
    with torch.no_grad():
        plain = enc(input_ids=ids).last_hidden_state
        with ap.apply(user_model, tau=rows) as st:
            assert st.tau == Schedule.of(rows)
            got = enc(input_ids=ids).last_hidden_state
        with ap.apply(user_model, tau=rows.to_dict()):
            again = enc(input_ids=ids).last_hidden_state
        with ap.apply(user_model, tau=1.0), attention_call(Choice.of(tau=rows)):  # aligned, rows per call
            want = enc(input_ids=ids).last_hidden_state
    assert torch.equal(got, want) and torch.equal(again, want)
    assert not torch.allclose(got, plain, atol=1e-4)
    with pytest.raises(UserError, match="floor_scale"):
        with ap.apply(user_model, tau={"scheme": "llama4", "floor_scale": 0}):
            pass


def test_context_is_per_thread(user_model, tok):
    """The schedule rides in this thread's context: a thread started inside the block runs tau = 1."""
    plain = _answer(user_model, tok)
    seen = {}
    with ap.apply(user_model, tau=0.7):
        inside = _answer(user_model, tok)
        th = threading.Thread(target=lambda: seen.setdefault("other", _answer(user_model, tok)))
        th.start()
        th.join()
    assert inside != plain and seen["other"] == plain


def test_install_is_permanent_per_model_and_uninstall_restores(chatty_dir, tok):
    a = T5ForConditionalGeneration.from_pretrained(str(chatty_dir)).eval()
    b = T5ForConditionalGeneration.from_pretrained(str(chatty_dir)).eval()
    plain = _answer(a, tok)
    with ap.apply(a, tau=0.7):
        want = _answer(a, tok)
    impls, state = _impls(a), _state(a)

    ap.install(a, tau=0.7)
    assert ap.installed(a).tau == Schedule.of(0.7) and ap.installed(b) is None
    name = a.config._attn_implementation
    assert is_aligned(name) and name != ATTN_NAME  # its own name: the settings travel with the call
    assert all(not [k for k in vars(m) if k.startswith("_aligned")] for m in attention_modules(a))  # nothing pinned
    got = {}
    th = threading.Thread(target=lambda: got.setdefault("thread", _answer(a, tok)))
    th.start()
    th.join()
    assert got["thread"] == want == _answer(a, tok)  # any thread, no context needed
    assert _answer(b, tok) == plain  # the other model is untouched
    with ap.apply(a, tau=1.0):  # an explicit block wins over the installed tau
        assert _answer(a, tok) == plain
    assert _answer(a, tok) == want
    ap.install(a, tau=1.0)  # re-install replaces the schedule
    assert _answer(a, tok) == plain
    assert "aligned" not in a.config.to_json_string()

    ap.uninstall(a)
    assert _impls(a) == impls and _state(a) == state
    assert _answer(a, tok) == plain
    ap.uninstall(a)  # a second uninstall is a no-op


@pytest.mark.parametrize("arch", ["bart", "gpt2"])
def test_refuses_other_architectures(arch):
    if arch == "bart":
        from transformers import BartConfig, BartForConditionalGeneration

        model = BartForConditionalGeneration(
            BartConfig(
                vocab_size=64,
                d_model=16,
                encoder_layers=1,
                decoder_layers=1,
                encoder_attention_heads=2,
                decoder_attention_heads=2,
                encoder_ffn_dim=16,
                decoder_ffn_dim=16,
                max_position_embeddings=64,
            )
        )
        name = "BartForConditionalGeneration"
    else:
        from transformers import GPT2Config, GPT2LMHeadModel

        model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=16, n_layer=1, n_head=2, n_positions=64))
        name = "GPT2LMHeadModel"
    before = model.config._attn_implementation
    with pytest.raises(UserError) as err:
        with ap.apply(model, tau=0.7):
            pass
    msg = str(err.value)
    assert name in msg and f"'{arch}'" in msg
    for works in (
        "T5ForConditionalGeneration",
        "T5EncoderModel",
        "MT5ForConditionalGeneration",
        "UMT5ForConditionalGeneration",
    ):
        assert works in msg
    with pytest.raises(UserError, match=name):
        ap.install(model, tau=0.7)
    assert model.config._attn_implementation == before


def _tiny_family(kind: str):
    from transformers import (
        MT5Config,
        MT5ForConditionalGeneration,
        T5EncoderModel,
        UMT5Config,
        UMT5ForConditionalGeneration,
    )

    common = dict(
        vocab_size=128,
        d_model=32,
        d_kv=8,
        d_ff=64,
        num_layers=2,
        num_decoder_layers=1,
        num_heads=4,
        relative_attention_num_buckets=16,
        relative_attention_max_distance=64,
        dropout_rate=0.0,
        decoder_start_token_id=0,
        pad_token_id=0,
        eos_token_id=1,
    )
    torch.manual_seed(1)
    if kind == "mt5":
        return MT5ForConditionalGeneration(MT5Config(**common)).eval()
    if kind == "umt5":
        return UMT5ForConditionalGeneration(UMT5Config(**common)).eval()
    return T5EncoderModel(T5Config(**common)).eval()


@pytest.mark.parametrize("kind", ["mt5", "umt5", "t5-encoder"])
def test_other_t5_family_classes(kind):
    model = _tiny_family(kind)
    ids = torch.randint(3, 128, (2, 40), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, 30:] = 0
    kw = {} if kind == "t5-encoder" else {"decoder_input_ids": torch.tensor([[0, 5, 7], [0, 9, 11]])}

    def out():
        with torch.no_grad():
            o = model(input_ids=ids, attention_mask=mask, **kw)
        return o.last_hidden_state if kind == "t5-encoder" else o.logits

    before, impls = out(), _impls(model)
    with ap.apply(model, tau=1.0):
        same = out()
    with ap.apply(model, tau=0.5):
        sharp = out()
    assert torch.allclose(same, before, atol=1e-5), (same - before).abs().max()
    assert not torch.allclose(sharp, before, atol=1e-3)
    assert _impls(model) == impls and torch.equal(out(), before)


def test_settings_json_round_trip(chatty_dir, user_model, tok, tmp_path, capsys):
    """The app's export (Settings.to_json) drives the CLI (--settings) and core.runs.apply to the same answer."""
    n = len(tok(TEXT).input_ids)
    doc = DocumentRequest(task="text", text=CONTEXT, needle="", question=QUESTION)
    exported = Settings(model=str(chatty_dir), method="fixed", tau=0.7, chosen_at=n, document=doc)
    f = tmp_path / "settings.json"
    f.write_text(exported.to_json())
    assert Settings.load(f) == exported

    got_cli = _cli_json(capsys, ["run", "--settings", str(f), "--json"])
    with ap.apply(user_model, settings=f) as st:
        assert st.tau == Schedule.of(0.7)
        got_apply = _answer(user_model, tok)
    with ap.apply(user_model, settings=Settings.load(f)):
        assert _answer(user_model, tok) == got_apply
    assert got_cli["answer"] == got_apply and got_cli["tau"] == 0.7 and got_cli["tokens"] == n

    # a length-dependent method: the CLI uses the stored tau at the length it was chosen at,
    # re-resolves it at any other length; core.runs.apply always uses the stored tau as is
    for chosen_at, want in ((n, 0.9), (n + 100, temperature.log_length(64, n))):
        st = Settings(model=str(chatty_dir), method="log-length", tau=0.9, chosen_at=chosen_at, document=doc)
        f.write_text(st.to_json())
        got = _cli_json(capsys, ["run", "--settings", str(f), "--json"])
        assert got["method"] == "log-length" and got["tau"] == pytest.approx(want, abs=1e-9)
        with ap.apply(user_model, settings=str(f)) as used:
            assert used.tau == Schedule.of(0.9)
    # explicit arguments override the file; a file with no resolved tau is refused with a hint
    with ap.apply(user_model, settings=f, tau=0.8) as used:
        assert used.tau == Schedule.of(0.8)
    f.write_text(Settings(method="pmax", tau=None).to_json())
    with pytest.raises(UserError, match="no resolved tau"):
        with ap.apply(user_model, settings=f):
            pass
    assert user_model.config._attn_implementation == "sdpa"


def test_install_inside_apply_survives_the_block_and_uninstall_restores(chatty_dir, tok):
    """install() in an apply block: the block's end keeps the install; uninstall() puts back the original."""
    a = T5ForConditionalGeneration.from_pretrained(str(chatty_dir)).eval()
    plain = _answer(a, tok)
    impls, state = _impls(a), _state(a)
    with ap.apply(a, tau=0.7):
        want = _answer(a, tok)
    with ap.apply(a, tau=1.0):
        ap.install(a, tau=0.7)
        assert _answer(a, tok) == plain  # the block's tau wins inside it
    assert is_aligned(a.config._attn_implementation)  # the install is still in force
    assert _answer(a, tok) == want
    ap.uninstall(a)
    assert _impls(a) == impls and _state(a) == state and _answer(a, tok) == plain

    with ap.apply(a, tau=1.0):  # uninstall inside a block: ours stays until the block ends
        ap.install(a, tau=0.7)
        ap.uninstall(a)
        assert a.config._attn_implementation == ATTN_NAME
    assert _impls(a) == impls and _state(a) == state


@pytest.mark.parametrize(
    "bad", ["0.5", True, [True, 0.5], {"tau": 0.5}, None, [[0.5, "x"], [0.5, 0.5]], float("nan"), -1.0, [0.5, [0.6]]]
)
def test_tau_of_the_wrong_type_is_refused(user_model, bad):
    with pytest.raises(UserError):
        with ap.apply(user_model, schedule=bad) if isinstance(bad, list) else ap.apply(user_model, tau=bad):
            pass
    with pytest.raises(UserError):
        ap.install(user_model, tau=bad) if not isinstance(bad, list) else ap.install(user_model, schedule=bad)
    assert user_model.config._attn_implementation == "sdpa" and ap.installed(user_model) is None


@pytest.mark.parametrize(
    "kw",
    [
        dict(cosine_scale="2"),
        dict(cosine_scale=float("inf")),
        dict(cosine_scale=True),
        dict(chunk_bytes=0),
        dict(chunk_bytes="1k"),
        dict(targets="enc"),
        dict(targets=["encoder", 3]),
    ],
)
def test_other_bad_arguments_are_refused(user_model, kw):
    with pytest.raises(UserError):
        with ap.apply(user_model, tau=0.7, **kw):
            pass
    assert user_model.config._attn_implementation == "sdpa"
