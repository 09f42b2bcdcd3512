"""Position schemes wired through the library (core.runs.rope_pass, core.mechanics.attention, core.runs.engine, core.experiments.mlm, the CLI).

Each scheme, run through the project's attention on a tiny ModernBERT loaded by core.models.load, is compared
with something that does not share its code: frequency schemes with transformers' own model built from the
scheme's config (``positions.configured``), mask schemes with transformers' eager attention given the same mask
as an explicit additive mask, rectified schemes (ReRoPE, StreamingLLM, LM-Infinite) with attention written out
here from one layer's unrotated q, k and v at the capped distances; each on the fused and the probed path, in
several blocks of rows, and with a tau on top. Then the pass's state: the model exactly restored (after an
error too), two threads with two schemes at once, calibration under the scheme, and ``python -m core mlm
--schemes``.
"""

from __future__ import annotations

import json
import math
import threading

import numpy as np
import pytest
import torch
from transformers import ModernBertForMaskedLM

from conftest import build_tiny_rope
from core import cli
from core.data import tasks
from core.errors import UserError
from core.experiments import mlm
from core.mechanics.probes import ProbeSpec, Recorder
from core.mechanics.run_pass import Pass
from core.models import load
from core.runs import engine, methods, rope_pass
from core.values import positions
from core.values.choice import Choice

L_TR = 16
N = 40  # 2.5 x L_TR: every scheme changes something
FULL = "full_attention"
FREQUENCY = [n for n in positions.AVAILABLE if positions.get(n).changes == (positions.FREQUENCIES,)]
MASK_ONLY = [n for n in positions.AVAILABLE if positions.get(n).changes == (positions.MASK,)]
RECTIFIED = [n for n in positions.AVAILABLE if positions.DISTANCES in positions.get(n).changes]
#: small enough that a pass of N tokens takes several blocks of rows on every path (a rectified block's quarter too)
SMALL_BLOCKS = 4 * 4 * N * 4 * 7


def test_the_lists_cover_every_available_scheme():
    assert set(FREQUENCY) | set(MASK_ONLY) | set(RECTIFIED) | {positions.PLAIN} == set(positions.AVAILABLE)
    assert FREQUENCY and MASK_ONLY and RECTIFIED


@pytest.fixture(scope="module")
def rope_dir(tmp_path_factory):
    return build_tiny_rope(tmp_path_factory.mktemp("wired-rope"), train_length=L_TR, seed=3)


@pytest.fixture(scope="module")
def rope(rope_dir):
    return load(str(rope_dir), device="cpu")


def _ids(n: int, seed: int = 1, batch: int = 1) -> torch.Tensor:
    return torch.randint(10, 2000, (batch, n), generator=torch.Generator().manual_seed(seed))


def _ours(
    loaded,
    scheme: str,
    ids: torch.Tensor,
    tau: float = 1.0,
    probed: bool = False,
    attention_mask: torch.Tensor | None = None,
    **params,
) -> torch.Tensor:
    """The masked-LM logits of our pass under ``scheme`` (through core.runs.rope_pass, in several blocks of rows);
    ``probed``: a recorder asks for Pmax and entropy, so the blocked softmax runs instead of torch's kernel."""
    rec = Recorder(ProbeSpec.stats_only(), torch.ones(ids.shape, dtype=torch.bool)) if probed else None
    choice = Choice.of(tau=tau, scheme=positions.Scheme.of(scheme, params))
    with torch.no_grad(), rope_pass.scheme_pass(loaded, choice, Pass(chunk_bytes=SMALL_BLOCKS), rec, ids.shape[1]):
        out = loaded.model(input_ids=ids, attention_mask=attention_mask).logits
    if probed:
        record = rec.finish()
        assert np.isfinite(record.pmax[0]).all() and (record.pmax[0] > 0).all()
    return out


def _reference(rope_dir, config=None, tau: float = 1.0) -> ModernBertForMaskedLM:
    """transformers' eager ModernBERT with the same weights (and ``config``, e.g. a scheme's), W_q / tau: what
    dividing q.k by tau means."""
    more = {} if config is None else {"config": config}
    ref = ModernBertForMaskedLM.from_pretrained(str(rope_dir), attn_implementation="eager", **more).eval()
    if config is not None:
        assert ref.config.rope_parameters == config.rope_parameters
    with torch.no_grad():
        for layer in ref.model.layers:
            layer.attn.Wqkv.weight[: ref.config.hidden_size].div_(tau)
    return ref


def _additive(allowed: torch.Tensor) -> torch.Tensor:
    return torch.zeros(allowed.shape, dtype=torch.float32).masked_fill(~allowed, torch.finfo(torch.float32).min)


@pytest.mark.parametrize("probed", [False, True])
@pytest.mark.parametrize("name", FREQUENCY)
def test_frequency_schemes_equal_transformers_model_with_the_scheme_config(rope, rope_dir, name, probed):
    ids = _ids(N)
    bound = positions.get(name).bind(L_TR, N)
    ref = _reference(rope_dir, positions.configured(rope.model.config, bound))
    with torch.no_grad():
        want = ref(input_ids=ids).logits
        plain = _reference(rope_dir)(input_ids=ids).logits
    got = _ours(rope, name, ids, probed=probed)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert (got - plain).abs().max() > 2e-4  # the scheme changed something


@pytest.mark.parametrize("probed", [False, True])
@pytest.mark.parametrize("name", MASK_ONLY)
def test_mask_schemes_equal_eager_attention_given_the_same_mask(rope, rope_dir, name, probed):
    ids = _ids(N)
    bound = positions.get(name).bind(L_TR, N, window=5)
    additive = _additive(bound.mask(N, N))[None, None]
    with torch.no_grad():
        want = _reference(rope_dir)(
            input_ids=ids, attention_mask={FULL: additive, "sliding_attention": additive}
        ).logits
    got = _ours(rope, name, ids, probed=probed, window=5)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert (got - _ours(rope, positions.PLAIN, ids)).abs().max() > 2e-4


@pytest.mark.parametrize("probed", [False, True])
def test_a_mask_scheme_on_a_padded_batch(rope, rope_dir, probed):
    """Padding and the window together; the padding rows far from the text see no key at all under the window:
    finite anyway (an additive floor, as eager), and the real rows equal eager's with both masks."""
    ids = _ids(N, batch=2)
    real = 12
    pad = torch.ones(2, N, dtype=torch.long)
    pad[1, real:] = 0
    bound = positions.get("window").bind(L_TR, N, window=3)
    allowed = bound.mask(N, N)[None, None] & pad.bool()[:, None, None, :]
    additive = _additive(allowed)
    with torch.no_grad():
        want = _reference(rope_dir)(
            input_ids=ids, attention_mask={FULL: additive, "sliding_attention": additive}
        ).logits
    got = _ours(rope, "window", ids, probed=probed, attention_mask=pad, window=3)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got[1, :real], want[1, :real], rtol=1e-5, atol=1e-5)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    d = x.shape[-1] // 2
    return torch.cat((-x[..., d:], x[..., :d]), dim=-1)


def _hand_layer(
    attn_module,
    hidden: torch.Tensor,
    inv: torch.Tensor,
    distances: torch.Tensor,
    allowed: torch.Tensor | None,
    tau: float,
) -> torch.Tensor:
    """One ModernBERT attention written out in float64 from its unrotated q, k, v: logit(i, j) = rot(q_i, d_ij) .
    k_j x scaling / tau (q turned by the capped distance, k by none: RoPE's logit at that distance), the mask,
    softmax, values, W_o."""
    b, n, _ = hidden.shape
    dh = attn_module.head_dim
    heads = attn_module.config.num_attention_heads
    qkv = attn_module.Wqkv(hidden).double().view(b, n, 3, heads, dh)
    q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))  # [b, h, n, d]
    angle = distances.double()[..., None] * inv.double()  # [n, n, d/2]
    cos, sin = torch.cat((angle, angle), -1).cos(), torch.cat((angle, angle), -1).sin()  # [n, n, d]
    q_at = q[:, :, :, None, :] * cos + _rotate_half(q)[:, :, :, None, :] * sin  # [b, h, i, j, d]
    logits = (q_at * k[:, :, None, :, :]).sum(-1) * (dh**-0.5) / tau
    if allowed is not None:
        logits = logits.masked_fill(~allowed, -math.inf)
    out = torch.softmax(logits, -1) @ v  # [b, h, n, d]
    return attn_module.Wo(out.transpose(1, 2).reshape(b, n, heads * dh).float())


def _layer_io(loaded, layer: int, run) -> tuple[torch.Tensor, torch.Tensor]:
    """The hidden states entering one attention module and what it returns, during ``run()``."""
    got: dict = {}
    attn = loaded.model.model.layers[layer].attn

    def take_in(module, args, kwargs) -> None:
        got.setdefault("in", kwargs["hidden_states"] if "hidden_states" in kwargs else args[0])

    def take_out(module, args, out) -> None:
        got.setdefault("out", out[0] if isinstance(out, tuple) else out)

    pre = attn.register_forward_pre_hook(take_in, with_kwargs=True)
    post = attn.register_forward_hook(take_out)
    try:
        run()
    finally:
        pre.remove()
        post.remove()
    return got["in"], got["out"]


@pytest.mark.parametrize("tau", [1.0, 0.7])
@pytest.mark.parametrize("probed", [False, True])
@pytest.mark.parametrize(
    "name, params",
    [
        ("rerope", {"window": 4}),
        ("streaming-llm", {"window": 5, "sinks": 3}),
        ("lm-infinite", {"window": 6, "sinks": 2, "cap": 4}),
    ],
)
def test_rectified_schemes_equal_attention_written_out_from_unrotated_q_and_k(rope, name, params, probed, tau):
    ids = _ids(N)
    bound = positions.get(name).bind(L_TR, N, **params)
    for layer in (0, 1):
        hidden, out = _layer_io(rope, layer, lambda: _ours(rope, name, ids, tau=tau, probed=probed, **params))
        inv, a = positions.model_frequencies(rope.model.config, FULL)  # the model's own: rectified schemes keep them
        assert a == 1.0
        distances = bound.capped_positions(0, N, N)
        assert (distances != positions.relative_positions(0, N, N)).any()  # some distance is capped here
        with torch.no_grad():
            want = _hand_layer(rope.model.model.layers[layer].attn, hidden, inv, distances, bound.mask(N, N), tau)
        torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("probed", [False, True])
def test_a_scheme_with_a_tau_is_the_scheme_s_reference_with_logits_over_tau(rope, rope_dir, probed):
    ids = _ids(N, seed=4)
    tau = 0.7
    # window + tau: eager with the band and W_q / tau
    additive = _additive(positions.get("window").bind(L_TR, N, window=5).mask(N, N))[None, None]
    with torch.no_grad():
        want = _reference(rope_dir, tau=tau)(
            input_ids=ids, attention_mask={FULL: additive, "sliding_attention": additive}
        ).logits
    torch.testing.assert_close(_ours(rope, "window", ids, tau=tau, probed=probed, window=5), want, rtol=1e-5, atol=1e-5)
    # PI + tau: transformers' model with PI's config and W_q / tau
    ref = _reference(rope_dir, positions.configured(rope.model.config, positions.get("pi").bind(L_TR, N)), tau=tau)
    with torch.no_grad():
        want = ref(input_ids=ids).logits
    torch.testing.assert_close(_ours(rope, "pi", ids, tau=tau, probed=probed), want, rtol=1e-5, atol=1e-5)


def _yarn_tau(n: int) -> float:
    """The temperature method of YaRN's paper, asked of the registry (no method named here)."""
    entry = methods.REGISTRY[methods.YARN]
    return entry.formula(L_TR, n, 16, None)


def test_yarn_rope_with_the_yarn_method_counts_the_factor_twice_unless_bound_without_it(rope):
    """docs/positions.md, YaRN's two halves: yarn-rope carries (0.1 ln s + 1) on cos and sin, the method of the
    same paper is tau = (0.1 ln s + 1)^-2 on the logits. Frequencies alone + the method = yarn-rope as it is."""
    ids = _ids(N, seed=5)
    tau = _yarn_tau(N)
    assert math.isclose(tau, (0.1 * math.log(N / L_TR) + 1) ** -2)
    whole = _ours(rope, "yarn-rope", ids)
    halves = _ours(rope, "yarn-rope", ids, tau=tau, attention_factor=1.0)
    torch.testing.assert_close(halves, whole, rtol=1e-5, atol=1e-5)
    twice = _ours(rope, "yarn-rope", ids, tau=tau)
    assert (twice - whole).abs().max() > 2e-4
    b = positions.get("yarn-rope").bind(L_TR, N)
    assert math.isclose(rope_pass.attention_factor(rope, b), 0.1 * math.log(N / L_TR) + 1, rel_tol=1e-6)
    assert rope_pass.attention_factor(rope, positions.get("yarn-rope").bind(L_TR, N, attention_factor=1.0)) == 1.0
    assert rope_pass.attention_factor(rope, positions.get("pi").bind(L_TR, N)) == 1.0


def test_a_cosine_model_cancels_yarn_s_attention_factor(tmp_path):
    cos = load(str(build_tiny_rope(tmp_path, cosine=12.0, seed=8, train_length=L_TR)), device="cpu")
    ids = _ids(N, seed=6)
    torch.testing.assert_close(
        _ours(cos, "yarn-rope", ids), _ours(cos, "yarn-rope", ids, attention_factor=1.0), rtol=1e-5, atol=1e-5
    )
    assert rope_pass.attention_factor(cos, positions.get("yarn-rope").bind(L_TR, N)) == 1.0


def _state(model) -> list:
    """Everything a pass may touch: each rotary module's buffers, scalings and rope types, and the weights."""
    out = []
    for m in positions.rotary_modules(model):
        out += [(k, v.clone()) for k, v in m.named_buffers()]
        out += [(k, v) for k, v in vars(m).items() if k.endswith("attention_scaling")]
        out.append(("rope_type", dict(m.rope_type)))
    out += [(k, v.clone()) for k, v in model.state_dict().items()]
    return out


def _same(a: list, b: list) -> bool:
    return len(a) == len(b) and all(
        ka == kb and (torch.equal(va, vb) if isinstance(va, torch.Tensor) else va == vb)
        for (ka, va), (kb, vb) in zip(a, b)
    )


@pytest.mark.parametrize("name", [n for n in positions.AVAILABLE if n != positions.PLAIN])
def test_a_scheme_pass_changes_nothing_of_the_shared_model(rope, name):
    """The scheme travels with the call: no buffer, scaling or rope type of the model changes during a pass, after
    it, or after an error inside it, and a plain pass after a scheme's gives the same logits as before."""
    ids = _ids(24)
    before, logits = _state(rope.model), _ours(rope, positions.PLAIN, ids)
    scheme_logits = _ours(rope, name, ids)
    assert _same(_state(rope.model), before)
    with pytest.raises(RuntimeError, match="boom"):
        with rope_pass.scheme_pass(rope, Choice.of(scheme=positions.Scheme.of(name)), None, None, 24):
            assert _same(_state(rope.model), before)
            if positions.get(name).changes != (positions.MASK,):  # and yet this scheme's logits differ
                assert not torch.equal(scheme_logits, logits)
            raise RuntimeError("boom")
    assert _same(_state(rope.model), before)
    assert torch.equal(_ours(rope, positions.PLAIN, ids), logits)


def _race(loaded) -> tuple[torch.Tensor, torch.Tensor]:
    """Thread B runs a PI pass and, inside it (its first layer under way), waits for thread A's window pass (at
    most 1 s): A runs entirely inside B's pass, on the same model, with no lock between them."""
    ids = _ids(N, seed=7)
    b_inside, a_done = threading.Event(), threading.Event()
    got: dict = {}

    def hold(module, args, kwargs):
        if threading.current_thread().name == "B":
            b_inside.set()
            a_done.wait(1.0)

    hook = loaded.model.model.layers[0].attn.register_forward_pre_hook(hold, with_kwargs=True)

    def a() -> None:
        b_inside.wait(5.0)
        got["A"] = _ours(loaded, "window", ids, window=5)
        got["A inside B"] = not a_done.is_set()
        a_done.set()

    def b() -> None:
        got["B"] = _ours(loaded, "pi", ids)

    threads = [threading.Thread(target=a, name="A"), threading.Thread(target=b, name="B")]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    finally:
        hook.remove()
    assert got["A inside B"]  # the test really interleaved the two passes
    return got["A"], got["B"]


def test_two_threads_with_two_schemes_each_get_their_own(rope):
    ids = _ids(N, seed=7)
    want_a, want_b = _ours(rope, "window", ids, window=5), _ours(rope, "pi", ids)
    assert (want_a - want_b).abs().max() > 2e-4  # the schemes differ, so a mix-up would show
    before = _state(rope.model)
    got_a, got_b = _race(rope)
    assert torch.equal(got_a, want_a) and torch.equal(got_b, want_b)
    assert _same(_state(rope.model), before)


def test_measured_methods_calibrate_under_the_scheme(rope, monkeypatch):
    seen = []
    real = engine.run_encoded

    def spy(loaded, docs, encs, choice, how):
        seen.append((choice.scheme.name, choice.scheme.param_dict, encs[0].n))
        return real(loaded, docs, encs, choice, how)

    monkeypatch.setattr(engine, "run_encoded", spy)
    pmax = methods.ALGORITHM1["pmax"]
    rows = mlm.run_mlm(rope, mlm.MlmPlan(lengths=[2 * L_TR], methods=[pmax], sequences=1, schemes=("window:window=5",)))
    assert seen and all((s, p) == ("window", {"window": 5}) for s, p, _ in seen)
    assert {n for _, _, n in seen} == {2 * L_TR, L_TR}  # passes at L and the L_tr reference, both under it
    assert rows[0]["scheme"] == "window" and rows[0]["scheme_params"] == "window=5"


def test_t5_takes_only_the_plain_scheme(tiny):
    doc = tasks.make(tasks.LM, tiny.tokenizer, 64, seed=0)
    with pytest.raises(UserError, match="rotary"):
        engine.run(tiny, doc, Choice.of(scheme="pi"), engine.Pass(generate=False))
    engine.run(tiny, doc, Choice.of(scheme=positions.PLAIN), engine.Pass(generate=False))


def _cli(capsys, *argv: str) -> tuple[int, str, str]:
    rc = cli.main(["mlm", *argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_cli_every_available_scheme_at_two_lengths(rope_dir, capsys):
    schemes = list(positions.AVAILABLE) + ["yarn-rope:attention_factor=1"]
    rc, out, err = _cli(
        capsys,
        "--model",
        str(rope_dir),
        "--lengths",
        "1x,3x",
        "--schemes",
        ",".join(schemes),
        "--methods",
        f"{methods.AS_TRAINED},tau=0.7",
        "--sequences",
        "2",
        "--json",
    )
    assert rc == 0, err
    rows = json.loads(out)["rows"]
    keys = [(r["tokens"], r["scheme"], r["scheme_params"], r["method"]) for r in rows]
    want_schemes = [(n, "") for n in positions.AVAILABLE] + [("yarn-rope", "attention_factor=1")]
    assert keys == [
        (n, s, p, m) for n in (L_TR, 3 * L_TR) for s, p in want_schemes for m in (methods.AS_TRAINED, "tau=0.7")
    ]
    for r in rows:
        assert set(mlm.ROW_KEYS) == set(r)
        assert 0 <= r["accuracy"] <= 1 and r["perplexity"] > 1 and math.isfinite(r["nll"])
    cell = {(r["tokens"], r["scheme"], r["scheme_params"], r["method"]): r for r in rows}
    plain = {
        (n, m): cell[(n, positions.PLAIN, "", m)] for n in (L_TR, 3 * L_TR) for m in (methods.AS_TRAINED, "tau=0.7")
    }
    # at L = L_tr every scheme at its defaults is plain RoPE but ReRoPE (its window is L_tr / 2) and StreamingLLM
    # (its band, L_tr - 1 - sinks, hides the keys that far after a row: the sinks cover only the start)
    for (n, s, p, m), r in cell.items():
        if n == L_TR and s not in ("rerope", "streaming-llm"):
            assert math.isclose(r["nll"], plain[(n, m)]["nll"], rel_tol=1e-5), (s, p, m)
        if n == 3 * L_TR and s != positions.PLAIN:
            assert not math.isclose(r["nll"], plain[(n, m)]["nll"], rel_tol=1e-7), (s, p, m)
    factor = 0.1 * math.log(3) + 1
    assert math.isclose(cell[(3 * L_TR, "yarn-rope", "", methods.AS_TRAINED)]["attention_factor"], factor, rel_tol=1e-5)
    assert cell[(3 * L_TR, "yarn-rope", "attention_factor=1", methods.AS_TRAINED)]["attention_factor"] == 1.0
    assert all(r["attention_factor"] == 1.0 for r in rows if r["scheme"] != "yarn-rope" or r["tokens"] == L_TR)


def test_cli_scheme_params_reach_the_schemes_that_take_them(rope_dir, capsys):
    rc, out, err = _cli(
        capsys,
        "--model",
        str(rope_dir),
        "--lengths",
        "2x",
        "--schemes",
        "window,rerope,pi",
        "--scheme-params",
        "window=3",
        "--methods",
        methods.AS_TRAINED,
        "--sequences",
        "1",
        "--json",
    )
    assert rc == 0, err
    assert [(r["scheme"], r["scheme_params"]) for r in json.loads(out)["rows"]] == [
        ("window", "window=3"),
        ("rerope", "window=3"),
        ("pi", ""),
    ]


@pytest.mark.parametrize(
    "args, says",
    [
        (["--schemes", "alibi"], "needs a model trained with ALiBi"),
        (["--schemes", "pose"], "not available"),
        (["--schemes", "no-such"], "Unknown position scheme"),
        (["--schemes", "none,,pi"], "--schemes"),
        (["--schemes", "window:factor=2"], "takes window"),
        (["--schemes", "window:window=x"], "whole number"),
        (["--schemes", "pi:factor=0.5"], "factor must be a number >= 1"),
        (["--schemes", "window,window"], "twice"),
        (["--schemes", "pi", "--scheme-params", "cap=3"], "no listed scheme takes cap"),
        (["--scheme-params", "window"], "key=value"),
    ],
)
def test_cli_bad_schemes_are_one_line(rope_dir, capsys, args, says):
    rc, out, err = _cli(capsys, "--model", str(rope_dir), "--lengths", "1x", "--sequences", "1", *args, "--json")
    assert rc == 2 and out == ""
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and says in lines[0], err


def test_cli_refuses_a_scheme_for_t5(tiny_dir, capsys):
    rc, _, err = _cli(capsys, "--model", str(tiny_dir), "--lengths", "1x", "--schemes", "pi", "--json")
    assert rc == 2 and len(err.strip().splitlines()) == 1
