"""One module patches models (core.mechanics.patches): every patch listed, each undone exactly, none made elsewhere.

What a patch is here: any change this tool makes to a loaded model (a module's class, a config's attention
implementation, bookkeeping about the model) or to transformers' process-wide registries of attention
implementations. Each kind is listed in :data:`core.mechanics.patches.PATCHES`; these tests apply every one to a
tiny T5 and a tiny ModernBERT, undo them, and compare the model's state dict, every config (``to_dict()`` and
the private field transformers reads the implementation from) and every module's class with what they were; a
released registry name must hold nothing. A source scan over core/ and ui/ fails when a patch is made outside the
module (a class swap, a registry write, the private config field, a write into an object's ``__dict__``).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    ModernBertConfig,
    ModernBertForMaskedLM,
    T5Config,
    T5ForConditionalGeneration,
)
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from core.kinds import ATTN_NAME
from core.mechanics import attention, patches, relative_bias
from core.runs import apply as apply_mod
from core.values import positions
from support.decoders import tiny_decoder_fields

ROOT = Path(__file__).resolve().parents[2]
FIELD = "_attn_implementation_internal"

#: Every patch these tests know how to check; a kind added to the module without a check here fails.
KNOWN = {"implementation", "lazy-bias", "rotary", "registry", "hold", "mlp-rows"}


def _t5(attn: str = "eager") -> T5ForConditionalGeneration:
    torch.manual_seed(0)
    cfg = T5Config(
        vocab_size=120,
        d_model=32,
        d_kv=8,
        d_ff=64,
        num_layers=2,
        num_decoder_layers=2,
        num_heads=4,
        relative_attention_num_buckets=32,
        relative_attention_max_distance=128,
        dropout_rate=0.0,
        decoder_start_token_id=0,
        pad_token_id=0,
        eos_token_id=1,
    )
    cfg._attn_implementation = attn
    return T5ForConditionalGeneration(cfg).eval()


def _modernbert(attn: str = "eager") -> ModernBertForMaskedLM:
    torch.manual_seed(0)
    cfg = ModernBertConfig(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        global_attn_every_n_layers=1,
        local_attention=16,
        max_position_embeddings=512,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=1,
        cls_token_id=1,
        sep_token_id=1,
        mask_token_id=2,
        attention_dropout=0.0,
        embedding_dropout=0.0,
        mlp_dropout=0.0,
    )
    cfg._attn_implementation = attn
    return ModernBertForMaskedLM(cfg).eval()


def _llama(attn: str = "eager") -> LlamaForCausalLM:
    torch.manual_seed(0)
    cfg = LlamaConfig(**tiny_decoder_fields())
    cfg._attn_implementation = attn
    return LlamaForCausalLM(cfg).eval()


BUILDERS = {"t5": _t5, "modernbert": _modernbert, "llama": _llama}
WANT = {"t5": {"implementation", "lazy-bias"}, "modernbert": {"implementation", "rotary"}}
WANT["llama"] = {"implementation", "rotary", "mlp-rows"}


def _state(model) -> dict:
    """Everything a patch may touch: the weights, every config (public dict and the private field), every class,
    and the model's own attributes."""
    return {
        "weights": {k: v.detach().clone() for k, v in model.state_dict().items()},
        "configs": [
            (id(c), c.to_dict(), c.__dict__.get(FIELD), c._attn_implementation) for c in patches.configs(model)
        ],
        "classes": [(name, type(m)) for name, m in model.named_modules()],
        "attributes": {name: sorted(m.__dict__) for name, m in model.named_modules()},
    }


def _same(model, before: dict) -> None:
    now = _state(model)
    assert now["weights"].keys() == before["weights"].keys()
    for key, value in before["weights"].items():
        assert torch.equal(now["weights"][key], value), key
    assert now["configs"] == before["configs"]
    assert now["classes"] == before["classes"]
    assert now["attributes"] == before["attributes"]


def _forward(model, kind: str) -> torch.Tensor:
    ids = torch.randint(3, 100, (1, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        if kind == "t5":
            return model(input_ids=ids, decoder_input_ids=ids[:, :3]).logits
        return model(input_ids=ids).logits


def test_the_module_lists_every_patch_and_the_test_knows_each():
    assert set(patches.PATCHES) == KNOWN


@pytest.mark.parametrize("kind", sorted(BUILDERS))
def test_patch_then_undo_gives_the_model_back(kind):
    """Every model patch at once (implementation, lazy bias, rotary), a pass through them, then undo."""
    model = BUILDERS[kind]()
    before = _state(model)
    done = patches.patch(model, implementation=ATTN_NAME, rotary=attention.current_positions)
    assert done.kinds == WANT[kind] and done.changed
    assert all(c._attn_implementation == ATTN_NAME for c in patches.configs(model))
    assert attention.served_by_us(model)
    if kind == "t5":
        assert relative_bias.installed(model)
    else:
        assert all(patches.rotating(m) for m in positions.rotary_modules(model))
    _forward(model, kind)
    again = patches.patch(model, implementation=ATTN_NAME, rotary=attention.current_positions)
    assert not again.changed and patches.patched(model) == [done]  # idempotent, nothing recorded twice
    done.undo()
    _same(model, before)
    assert patches.patched(model) == []
    done.undo()  # a second undo changes nothing
    _same(model, before)


@pytest.mark.parametrize("kind", sorted(BUILDERS))
def test_unpatch_undoes_every_patch_of_a_model(kind):
    """Two patches on one model (the load's, then a switch of implementation), undone together, newest first."""
    model = BUILDERS[kind]()
    before = _state(model)
    patches.patch(model, rotary=attention.current_positions if kind != "t5" else None)
    patches.patch(model, implementation=ATTN_NAME)
    assert len(patches.patched(model)) == 2
    patches.unpatch(model)
    _same(model, before)


@pytest.mark.parametrize("kind", sorted(BUILDERS))
def test_a_users_model_through_apply_and_install_comes_back_unchanged(kind):
    """core.runs.apply: the hold (bookkeeping beside the model), the standing name (registry), the switch of
    implementation and the class swaps, all undone when the last user lets go; nothing was written into the model."""
    model = BUILDERS[kind]()
    before = _state(model)
    want = _forward(model, kind)
    with apply_mod.apply(model, tau=1.0):
        assert patches.hold_of(model) is not None
        apply_mod.install(model, tau=1.0)
        name = model.config._attn_implementation
        assert name.startswith(f"{ATTN_NAME}@") and name in patches.registered_names()
        assert name in ALL_ATTENTION_FUNCTIONS and name in ALL_MASK_ATTENTION_FUNCTIONS
        torch.testing.assert_close(_forward(model, kind), want, atol=1e-4, rtol=1e-4)
        apply_mod.uninstall(model)
    assert patches.hold_of(model) is None
    assert name not in ALL_ATTENTION_FUNCTIONS and name not in ALL_MASK_ATTENTION_FUNCTIONS
    assert name not in patches.registered_names()
    _same(model, before)


def test_a_released_registry_name_holds_nothing():
    name = "aligned@patches-test"
    patches.register_name(name, attention.aligned_attention, sdpa_mask)
    assert ALL_ATTENTION_FUNCTIONS[name] is attention.aligned_attention and name in ALL_MASK_ATTENTION_FUNCTIONS
    patches.release_name(name)
    assert name not in ALL_ATTENTION_FUNCTIONS and name not in ALL_MASK_ATTENTION_FUNCTIONS
    with pytest.raises(KeyError):
        ALL_ATTENTION_FUNCTIONS[name]
    with pytest.raises(KeyError):
        ALL_MASK_ATTENTION_FUNCTIONS[name]
    patches.release_name(name)  # idempotent


def test_a_listener_leaves_no_name_behind():
    """attention.listen registers a standing name for its recorder; stopping it releases the name."""
    from core.mechanics.probes import ProbeSpec, Recorder

    model = _t5("aligned")
    patches.patch(model)
    before = _state(model)
    stop = attention.listen(model, Recorder(ProbeSpec.off()))
    name = model.config._attn_implementation
    assert name in ALL_ATTENTION_FUNCTIONS
    stop()
    assert name not in ALL_ATTENTION_FUNCTIONS
    _same(model, before)


# -- no patch outside the module ----------------------------------------------------------------------------------

#: What making a patch looks like in source: a class swap, a write to transformers' registries, the private config
#: field transformers reads the implementation from, and a write into an object's ``__dict__`` (bookkeeping on a
#: model or a module).
PATCH_PATTERNS = {
    "class swap": re.compile(r"__class__\s*=(?!=)"),
    "registry write": re.compile(r"\b\w*(?:Interface|ATTENTION_FUNCTIONS)\s*\.\s*register\s*\(|_global_mapping"),
    "private config field": re.compile(r"_attn_implementation_internal"),
    "a model's implementation": re.compile(r"\.config\._attn_implementation\s*=(?!=)|\bset_attn_implementation\s*\("),
    "__dict__ write": re.compile(
        r"__dict__\s*\[[^\]]*\]\s*=(?!=)|__dict__\s*\.\s*(?:setdefault|update|pop|clear)\s*\("
        r"|\bdel\s+[\w.]*__dict__\s*\["
    ),
}
PATCHES_MODULE = ROOT / "core" / "mechanics" / "patches.py"


def _patch_sites() -> list[str]:
    found = []
    for top in ("core", "ui"):
        for path in sorted((ROOT / top).rglob("*.py")):
            if path == PATCHES_MODULE:
                continue
            for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                for what, pattern in PATCH_PATTERNS.items():
                    if pattern.search(line):
                        found.append(f"{path.relative_to(ROOT)}:{n} {what}: {line.strip()}")
    return found


def test_no_patch_is_made_outside_the_patches_module():
    assert _patch_sites() == []


@pytest.mark.parametrize(
    "line",
    [
        "    module.__class__ = Sub",
        "    AttentionInterface.register(name, fn)",
        "    AttentionMaskInterface.register(name, mask)",
        "    cfg.__dict__['_attn_implementation_internal'] = name",
        "    model.__dict__[_HOLD] = hold",
        "    m.__dict__.pop(_ORIGINAL, None)",
        "    model.config._attn_implementation = ATTN_NAME",
        "    model.set_attn_implementation(name)",
    ],
)
def test_the_scan_sees_each_kind_of_patch(line):
    assert any(p.search(line) for p in PATCH_PATTERNS.values())


def test_the_scan_leaves_reads_alone():
    for line in ("if type(m).__class__ == x:", "x = cfg.__dict__.get('a')", "atexit.register(stop)"):
        assert not any(p.search(line) for p in PATCH_PATTERNS.values()), line


def test_a_decoders_feed_forward_runs_in_blocks_of_rows_as_it_ran_whole(monkeypatch):
    """mlp-rows: a long input's feed-forward output, position by position, is the module's own (blocks of 7 rows
    here); a short input, or another shape, goes to the module as it is."""
    model = _llama()
    mlps = patches.feed_forwards(model)
    assert len(mlps) == 2 and patches.feed_forwards(_t5()) == [] and patches.feed_forwards(_modernbert()) == []
    own = [type(m) for m in mlps]
    x = torch.randn(2, 23, 64, generator=torch.Generator().manual_seed(3))  # hidden_size of tiny_decoder_fields
    with torch.no_grad():
        want = [m(x) for m in mlps]
    patches.patch(model)
    monkeypatch.setattr(patches, "MLP_ROWS", 7)
    calls = []
    cls = own[0]
    assert own == [cls, cls] and all(type(m) is not cls and isinstance(m, cls) for m in mlps)
    forward = cls.forward
    monkeypatch.setattr(cls, "forward", lambda self, h: calls.append(h.shape[1]) or forward(self, h))
    for m, w in zip(mlps, want):
        with torch.no_grad():
            torch.testing.assert_close(m(x), w, rtol=1e-6, atol=1e-6)
    assert calls == [7, 7, 7, 2] * 2
    with torch.no_grad():
        mlps[0](x[:, :5])
    assert calls[-1] == 5
    patches.unpatch(model)
    assert [type(m) for m in mlps] == own
