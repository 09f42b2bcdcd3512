"""Attention Alignment Explorer's library: T5 attention with a softmax temperature, probed.

Import what you need from the submodules (``core.models.load``,
``core.runs.engine.run``, ``core.runs.methods.resolve``, ...); nothing here imports
Streamlit. ``python -m core --help`` is the CLI.
"""

import os as _os

# Torch's OpenMP worker threads spin for a while after every parallel region (GNU libgomp's default wait
# policy), waiting for the next one. On a machine with other work (a second session, a sweep, a training run:
# even one niced process) those spinning threads take the cores the pass itself needs: the default model's
# probed pass at 8,192 tokens took 33.6 s with 2 threads beside one niced process, 6.0 s with passive
# waiting, 4.3 s on an idle machine (bench/README.md, bench/threads.py). libgomp reads the policy once, when
# torch is first imported, which for the CLI, the app and Ray's workers is after this line; a choice already
# in the environment wins.
_os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
