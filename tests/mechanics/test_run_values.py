"""A run's two values: its Choice (what: method, tau, targets, CosScale, scheme, the method's own numbers) and its
Pass (how: probes, block budget, generation, device); each checked once, where it is made, and refused in one
line; the settings file converts to a Choice in one place (Settings.to_choice); the targets have one rule."""

from __future__ import annotations

import argparse

import pytest

from core.errors import UserError
from core.mechanics import attention
from core.mechanics.probes import ProbeSpec
from core.mechanics.run_pass import DEFAULT_PASS, Pass
from core.runs.settings import Settings
from core.values.choice import TRAINED, Choice, targets_of


def test_a_pass_is_a_frozen_hashable_value_checked_when_made():
    assert Pass() == DEFAULT_PASS and hash(Pass()) == hash(DEFAULT_PASS)
    assert Pass(probes=ProbeSpec.off()) != Pass()  # a cache key's half: what it records changes the key
    for bad in (dict(chunk_bytes=0), dict(chunk_bytes=1.5), dict(chunk_bytes=True), dict(max_new_tokens=-1)):
        with pytest.raises(ValueError):
            Pass(**bad)
    with pytest.raises(TypeError):
        Pass(probes="stats")
    with pytest.raises(AttributeError):
        Pass().generate = False  # type: ignore[misc]


def test_the_attention_call_takes_the_two_values_in_order():
    with attention.attention_call(Choice.of(tau=0.7), Pass(chunk_bytes=4096)):
        call = attention.current_call()
        assert float(call.choice.tau) == 0.7 and call.how.chunk_bytes == 4096 and call.positions is None
    with attention.attention_call():
        assert attention.current_call().choice is TRAINED and attention.current_call().how is DEFAULT_PASS
    with pytest.raises(TypeError, match="recorder is the third"):  # a recorder where the Pass goes is refused
        with attention.attention_call(TRAINED, object()):
            pass
    assert attention.current_call() is None


def test_the_engine_refuses_a_pass_for_another_device(tiny):
    from core.data import tasks
    from core.runs import engine

    doc = tasks.make("passkey", tiny.tokenizer, 300, seed=1)
    with pytest.raises(UserError, match="device meta"):
        engine.run(tiny, doc, TRAINED, Pass(device="meta", generate=False))
    assert engine.run(tiny, doc, TRAINED, Pass(device="cpu", generate=False, probes=ProbeSpec.off())).tokens > 0


def test_method_params_are_part_of_the_choice():
    c = Choice.of("critical", 0.7, method_params={"gamma": 0.2})
    assert c.method_params == (("gamma", 0.2),) and c.params == {"gamma": 0.2} and hash(c)
    assert c.with_(tau=0.7) is c and c.with_(method_params={"gamma": 0.3}).params == {"gamma": 0.3}
    assert Choice.of(method_params=[("b", 1), ("a", 2)]).method_params == (("a", 2.0), ("b", 1.0))
    for bad in ({"gamma": "x"}, {"gamma": float("nan")}, {"gamma": True}, {3: 1.0}, 5):
        with pytest.raises(UserError):
            Choice.of(method_params=bad)
    chosen = Settings(method="critical", method_params={"gamma": 0.25})
    assert chosen.to_choice(0.7).params == {"gamma": 0.25}


def test_settings_convert_to_one_choice_in_one_place():
    chosen = Settings(
        method="fixed", tau=0.8, targets=["encoder", "cross"], scheme="window", scheme_params={"window": 16}
    )
    c = chosen.to_choice()
    assert c is chosen.to_choice() and c is chosen.to_choice(0.8)  # the stored tau: the one object, handed on
    assert float(chosen.to_choice(0.5).tau) == 0.5 and chosen.to_choice(0.5).scheme is c.scheme
    assert c.targets == ("encoder", "cross") and c.scheme.spell() == "window:window=16"
    with pytest.raises(UserError, match="no resolved tau"):
        Settings(method="log-length").to_choice()
    assert not hasattr(Settings, "run_settings") and not hasattr(Settings, "choice")


@pytest.mark.parametrize("bad", [["enc"], ["encoder", 3], "everything"])
def test_the_targets_have_one_rule_at_every_edge(bad):
    with pytest.raises(UserError) as rule:
        targets_of(bad)
    with pytest.raises(UserError) as choice:
        Choice.of(targets=bad)
    with pytest.raises(UserError) as settings:
        Settings(targets=bad)
    assert str(choice.value) == str(rule.value) and str(rule.value) in str(settings.value)
    if isinstance(bad, list) and all(isinstance(t, str) for t in bad):
        from core.cli.options import _targets

        with pytest.raises(argparse.ArgumentTypeError) as cli:
            _targets(",".join(bad))
        assert str(cli.value) == str(rule.value)
    assert targets_of("cross") == ("cross",) and targets_of(()) == () and targets_of(None) == ("encoder",)
