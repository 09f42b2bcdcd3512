"""What this machine gives the attention: device, precision, which backend a long pass takes and why.

Why a module of its own: the same facts are said in three places (``python -m core doctor``, the app's
"about this machine" line, every benchmark's header), and a user comparing two machines' speeds needs them
said the same way: a CPU pass is several times faster with the fused kernel (a C++ compiler) than without,
and AVX-512 or AVX2 decides how fast the kernel's exponentials run. Plain values in, a dict out; nothing here
builds or loads a model (asking for the kernel does build it, once, as a first pass would).
"""

from __future__ import annotations

import platform
import shutil
import subprocess

import torch

from core.mechanics import fused_softmax, softmax_block


def vector_isa() -> str:
    """The widest vector instruction set the CPU reports: ``avx512``, ``avx2``, ``neon``/``sve`` or ``none``.

    Read from ``/proc/cpuinfo`` (Linux); elsewhere the machine's name only."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line for line in f if line.startswith(("flags", "Features"))), "").split()
    except OSError:
        flags = []
    for flag, name in (("avx512f", "avx512"), ("avx2", "avx2"), ("sve", "sve"), ("asimd", "neon"), ("neon", "neon")):
        if flag in flags:
            return name
    return "none" if flags else f"unknown ({platform.machine()})"


def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else the platform's word for it."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def compiler() -> str | None:
    """The C++ compiler the kernel would be built with and its version line, or None."""
    path = shutil.which("g++") or shutil.which("c++")
    if path is None:
        return None
    try:
        first = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=10).stdout.splitlines()
    except (OSError, subprocess.SubprocessError):
        return path
    return f"{path} ({first[0].strip()})" if first else path


def cpu_path() -> tuple[str, str | None]:
    """``(backend, why)``: the backend a long float32 CPU pass takes (:mod:`core.mechanics.softmax_block`) and,
    when it is not the fused kernel, why not (no compiler, a failed build, switched off)."""
    if fused_softmax.available():
        return softmax_block.CPU_KERNEL, None
    return softmax_block.TORCH, fused_softmax.why_not() or "the fused kernel is not available"


def cuda_path() -> tuple[str, str | None] | None:
    """``(backend, why)`` for a GPU pass, or None without a GPU."""
    if not torch.cuda.is_available():
        return None
    backend = softmax_block.BACKENDS[softmax_block.CUDA]
    if backend.available:
        return softmax_block.CUDA, None
    return softmax_block.TORCH, backend.about


def describe() -> dict:
    """Everything ``doctor`` prints, as plain values (JSON-ready)."""
    import transformers

    cpu_backend, cpu_why = cpu_path()
    gpu = cuda_path()
    device = "cuda" if gpu is not None else "cpu"
    return {
        "device": device,
        "gpu": torch.cuda.get_device_name(0) if gpu is not None else None,
        "dtype": "bfloat16" if device == "cuda" else "float32",
        "backend": gpu[0] if gpu is not None else cpu_backend,
        "why": gpu[1] if gpu is not None else cpu_why,
        "cpu": cpu_name(),
        "cpu_backend": cpu_backend,
        "cpu_backend_why": cpu_why,
        "vector_isa": vector_isa(),
        "kernel_isa": fused_softmax.built_isa() if cpu_backend == softmax_block.CPU_KERNEL else None,
        "threads": torch.get_num_threads(),
        "compiler": compiler(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
    }


def one_line(facts: dict | None = None) -> str:
    """The facts in one sentence, as the app's sidebar and benchmark headers say them."""
    f = facts or describe()
    where = (
        f"GPU {f['gpu']} ({f['dtype']})" if f["device"] == "cuda" else f"CPU {f['cpu']} ({f['vector_isa']}, float32)"
    )
    path = f["backend"] + ("" if f["why"] is None else f" (fused kernel off: {f['why']})")
    return f"{where}, {f['threads']} threads; attention: {path}; torch {f['torch']}, transformers {f['transformers']}"
