"""``python -m core run --scheme NAME[:k=v...]`` (issue 56, item 4): a position scheme typed on the command line,
read by the one parser (:meth:`core.values.positions.Scheme.of`), on a tiny random Llama saved as a folder whose
config says 64 positions (so its answers go past the model's maximum length, as SmolLM2's do past 8,192): the same
numbers as the scheme given in a settings file, overriding the file's, one line (exit 2) for an unknown scheme, bad
parameters or a model without rotary positions (T5); and transformers' "friendly reminder" about the maximum length
is not printed during our generate calls, but still is for a caller's own afterwards."""

from __future__ import annotations

import json
import logging

import pytest
import torch
import transformers
from transformers.utils import logging as hf_logging

from core.cli import main
from core.runs.settings import Settings
from tests.runs.test_decoder_schemes import _save

REMINDER = "This is a friendly reminder"


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    return _save(tmp_path_factory.mktemp("tiny-llama-scheme-cli"), "llama")


def _run(capsys, *args) -> dict:
    assert main(["run", "--task", "passkey", "--tokens", "300", "--json", *args]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.slow
def test_scheme_option_runs_and_equals_the_settings_file(llama_dir, tmp_path, capsys):
    """``--scheme yarn-rope:factor=4`` changes the meters, and gives exactly what a settings file naming the same
    scheme gives; ``--scheme`` overrides the file's scheme and its parameters."""
    plain = _run(capsys, "--model", str(llama_dir))
    yarn = _run(capsys, "--model", str(llama_dir), "--scheme", "yarn-rope:factor=4")
    assert yarn["pmax"] != pytest.approx(plain["pmax"], rel=1e-6)
    f = tmp_path / "s.json"
    f.write_text(Settings(scheme="yarn-rope", scheme_params={"factor": 4}).to_json())
    from_file = _run(capsys, "--model", str(llama_dir), "--settings", str(f))
    assert from_file["pmax"] == yarn["pmax"] and from_file["layers"] == yarn["layers"]
    g = tmp_path / "w.json"
    g.write_text(Settings(scheme="pi", scheme_params={"factor": 2}).to_json())
    over = _run(capsys, "--model", str(llama_dir), "--settings", str(g), "--scheme", "yarn-rope:factor=4")
    assert over["pmax"] == yarn["pmax"]


@pytest.mark.parametrize(
    "scheme,needle",
    [
        ("nope", "Unknown position scheme 'nope'"),
        ("yarn-rope:factor=0.5", "factor must be a number >= 1"),
        ("window:sinks=2", "Position scheme 'window' takes window"),
        ("alibi", "is not available"),
    ],
)
def test_bad_scheme_is_one_line(llama_dir, capsys, scheme, needle):
    assert main(["run", "--model", str(llama_dir), "--scheme", scheme]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: argument --scheme: ") and needle in err and "\n" not in err


def test_scheme_on_t5_is_one_line(tiny_dir, capsys):
    """A model with its own relative positions (T5) takes no scheme: one line before any document is made."""
    assert main(["run", "--model", str(tiny_dir), "--scheme", "yarn-rope", "--tokens", "300"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: Position scheme 'yarn-rope' needs a rotary") and "\n" not in err


class _Seen(logging.Handler):
    """Keeps the messages the reminder's logger hands its handlers (after the logger's own filters)."""

    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def test_length_reminder_silenced_during_our_calls_only(llama_dir, capsys):
    """Our answer past the config's 64 positions logs no reminder; transformers' own generate afterwards (the
    filter gone) still does. The reminder is logged once per process, so its cache is cleared first."""
    logger = hf_logging.get_logger("transformers.generation.stopping_criteria")
    seen = _Seen()
    logger.addHandler(seen)
    try:
        hf_logging.warning_once.cache_clear()
        assert main(["run", "--model", str(llama_dir), "--task", "passkey", "--tokens", "300", "--json"]) == 0
        assert not any(m.startswith(REMINDER) for m in seen.messages)
        hf_logging.warning_once.cache_clear()
        model = transformers.AutoModelForCausalLM.from_pretrained(str(llama_dir), attn_implementation="eager")
        ids = torch.randint(3, 300, (1, 80))
        model.generate(
            input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=2, do_sample=False, pad_token_id=0
        )
        assert any(m.startswith(REMINDER) for m in seen.messages)
    finally:
        logger.removeHandler(seen)
