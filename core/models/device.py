"""Which device and precision a model runs in: CUDA with bfloat16 when a GPU is present, else CPU with float32,
unless the caller names one (float16 is refused: T5 overflows to NaN in it).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from core.errors import ModelLoadError

if TYPE_CHECKING:  # torch is imported where a device or dtype is made: the names are checked without it (the CLI)
    import torch

_DEVICE = re.compile(r"(auto|cpu|cuda(:\d{1,3})?)")


def check_device(requested: str | None) -> str | None:
    """``requested`` if it names a device we run on (auto, cpu, cuda, cuda:N), else a one-line ModelLoadError."""
    if requested in (None, ""):
        return None
    if not isinstance(requested, str) or not _DEVICE.fullmatch(requested.strip().lower()):
        raise ModelLoadError(f"Unknown device {str(requested)[:40]!r}: use cpu, cuda, cuda:N or auto")
    return requested.strip().lower()


#: Precisions a model may run in, by the names users type -> torch's name for each. float16 is absent on purpose:
#: T5's activations overflow it (NaN after a few layers), which is why a GPU gets bfloat16.
DTYPE_NAMES = {"float32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16"}


def dtype_name(requested: str | None) -> str | None:
    """torch's name of the dtype ``requested`` names (float32/fp32, bfloat16/bf16; None for auto), else a one-line
    ModelLoadError. Without torch, so that ``python -m core ... --dtype X`` is checked before torch is imported."""
    if requested in (None, "", "auto"):
        return None
    key = str(requested).strip().lower()
    if key in ("float16", "fp16", "half"):
        raise ModelLoadError("float16 is refused: T5 overflows in it (NaN); use bfloat16 or float32")
    if key not in DTYPE_NAMES:
        raise ModelLoadError(f"Unknown dtype {str(requested)[:40]!r}: use float32, bfloat16 or auto")
    return DTYPE_NAMES[key]


def check_dtype(requested: str | None) -> torch.dtype | None:
    """The torch dtype ``requested`` names (float32/fp32, bfloat16/bf16, auto), else a one-line ModelLoadError."""
    name = dtype_name(requested)
    if name is None:
        return None
    import torch

    return getattr(torch, name)


def pick_device(requested: str | None = None, dtype: str | None = None) -> tuple[torch.device, torch.dtype]:
    """CUDA + bf16 when present (fp16 overflows in T5), else CPU + fp32; ``dtype`` overrides the precision.

    Why an override: bfloat16 keeps 8 bits of mantissa, so a GPU run's Pmax and
    accuracies differ slightly from a CPU run's; float32 on a GPU reproduces
    CPU tables (bench/results.py --dtype float32) at GPU speed."""
    import torch

    requested = check_device(requested)
    if requested in (None, "auto"):
        requested = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(requested)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError(
            "CUDA was requested but no GPU is available; use --device cpu",
            app="CUDA was requested but this machine has no GPU available.",
        )
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise ModelLoadError(
            f"There is no GPU {dev.index} (this machine has {torch.cuda.device_count()}); use --device cuda",
            app=f"There is no GPU {dev.index} (this machine has {torch.cuda.device_count()}).",
        )
    chosen = check_dtype(dtype)
    return dev, chosen or (torch.bfloat16 if dev.type == "cuda" else torch.float32)
