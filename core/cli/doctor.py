"""``python -m core doctor``: this machine's facts (device, dtype, the attention's backend and why, ISA, threads,
compiler, versions) and what a C++ compiler buys here; nothing is loaded.
"""

from __future__ import annotations

import json

#: What a C++ compiler buys, in one sentence (``doctor``): measured with :data:`COMPILER_MEASURED`.
COMPILER_BUYS = (
    "a C++ compiler (g++) lets the CPU build the fused softmax kernel once (about a second) and take "
    "it for every long float32 pass, the same numbers as torch's path, which runs without one (or with "
    "AAE_FUSED_SOFTMAX=0): a {tokens:,}-token passkey pass took {with_s:g} s with it and {without_s:g} s "
    "without {where}"
)
#: The figures in :data:`COMPILER_BUYS`: ``python -m core run --tokens 8192 --json``'s ``seconds``, best of two
#: runs each way, 2026-11-28 03:47-03:55 UTC at load 4-9 (other sessions running): 12.5 / 23.1 s with the kernel,
#: 122.8 / 186.9 s without.
COMPILER_MEASURED = {
    "with_s": 12.5,
    "without_s": 123,
    "tokens": 8192,
    "where": "a 2-core Intel Xeon 2.5 GHz with AVX-512 (2026-11-28, load 4-9)",
    "cpu": "Intel Xeon",
    "vector_isa": "avx512",
}
#: How to measure :data:`COMPILER_BUYS`' figures on the machine at hand (doctor prints it where they come from another).
MEASURE_HERE = (
    "python -m core run --tokens {tokens} --json (its 'seconds'), then the same with AAE_FUSED_SOFTMAX=0 in front"
)


def where_measured(facts: dict) -> str:
    """Where :data:`COMPILER_BUYS`' figures come from, said against this machine's facts: the figures were measured on
    one CPU, and doctor runs on others (issue 59 point 10: it printed "this project's 2-core AVX-512 Xeon" while
    reporting an AVX2 EPYC). Same CPU kind and vector ISA: "a machine like this one"; else "another machine" with
    the command that measures them here."""
    m = COMPILER_MEASURED
    cpu, isa = str(facts.get("cpu") or ""), str(facts.get("vector_isa") or "")
    if cpu.startswith(m["cpu"]) and isa == m["vector_isa"]:
        return f"on {m['where']}, a machine like this one"
    here = f"{cpu or 'an unknown CPU'}, {isa or 'unknown vector ISA'}"
    return f"on {m['where']}: another machine than this one ({here}); to measure them here: " + MEASURE_HERE.format(
        tokens=m["tokens"]
    )


def command(args) -> int:
    """The machine's facts (:func:`core.mechanics.machine.describe`), what a compiler buys, nothing loaded."""
    from core.mechanics import machine

    facts = machine.describe()
    buys = COMPILER_BUYS.format(**{**COMPILER_MEASURED, "where": where_measured(facts)})
    if args.json:
        print(json.dumps({**facts, "summary": machine.one_line(facts), "compiler_buys": buys}, default=str))
        return 0
    print(machine.one_line(facts))
    width = max(map(len, facts))
    for key, value in facts.items():
        print(f"  {key:<{width}}  {'-' if value is None else value}")
    print(buys[0].upper() + buys[1:] + ".")
    return 0
