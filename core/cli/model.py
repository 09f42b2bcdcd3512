"""The model a command runs, and the checks against it: every length against this machine's memory, before any
document is built.

Why after :func:`core.cli.preflight.prepare`: a length given as ``2x`` and the memory a length needs are only known
once the model is loaded; the order (options, model, lengths, documents, output) is what keeps any input from eating
the machine. Torch is imported here only inside the functions, when a command calls them.
"""

from __future__ import annotations

from core.errors import InputTooLong
from core.runs import methods
from core.values.validation import Tokens, validate


def load_model(
    model: str | None,
    train_length: int | None,
    device: str | None = None,
    tokenizer: str | None = None,
    dtype: str | None = None,
):
    """The model a command names (default: the bundled one), with the download and loading bars off."""
    from huggingface_hub.utils import disable_progress_bars
    from transformers.utils import logging as hf_logging

    from core.errors import ModelLoadError
    from core.models import default_model, load

    hf_logging.disable_progress_bar()  # "Loading weights" bars would break the one-line error contract on stderr
    disable_progress_bars()  # and so would the hub's download bars
    name = model or default_model()
    if name is None:
        raise ModelLoadError("No model given and no bundled model in assets/models: pass --model NAME|HUB_ID|FOLDER")
    return load(name, device=device, train_length=train_length, tokenizer=tokenizer, dtype=dtype)


def precision(loaded) -> dict:
    """Where and in what precision the numbers were computed: bfloat16 moves Pmax and accuracies a little."""
    return {"device": str(loaded.device), "dtype": str(loaded.dtype).replace("torch.", "")}


def check_fits(loaded, tokens: int, what: str, batch: int = 1) -> None:
    """Refuse, before any document is built, ``tokens`` (x ``batch`` documents) this machine cannot run now."""
    from core.runs import engine

    cap = engine.max_tokens(loaded, batch)
    if tokens > cap:
        raise InputTooLong(
            f"{what} {tokens:,} tokens; this machine can run at most about {cap:,} tokens now"
            f"{f' for {batch} documents at once' if batch > 1 else ''}. Use a shorter document."
        )


def check_reference(loaded, names, samples: int = 1) -> None:
    """Measured methods run documents at L_tr (and ``samples`` of them at once): that length must fit too."""
    measured = sorted({m for m in names if methods.entry(m).measured})
    if measured:
        check_fits(loaded, loaded.train_length, f"{', '.join(measured)} measure(s) documents at L_tr =", batch=samples)


def document(loaded, chosen, samples: int = 1):
    """The run's document, refused before it is built when it (or its calibration batch) cannot fit."""
    return chosen.document.build_for(loaded, batch=samples)


def lengths(spec: list[tuple[float, bool]] | None, train_length: int) -> list[int]:
    """Token counts of a parsed ``--lengths`` (multiples of L_tr resolved now; default 1,2,4,8,16 x L_tr)."""
    spec = spec or [(k, True) for k in (1, 2, 4, 8, 16)]
    out = []
    for value, multiple in spec:
        n = int(round(value * train_length)) if multiple else int(value)
        label = f"{value:g}x of L_tr={train_length:,}" if multiple else str(n)
        out.append(validate(Tokens, n, f"--lengths {label}"))
    return out
