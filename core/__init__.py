"""Attention Alignment Explorer's library: T5 attention with a softmax temperature, probed.

Import what you need from the submodules (``core.models.load``,
``core.engine.run``, ``core.methods.resolve``, ...); nothing here imports
Streamlit. ``python -m core --help`` is the CLI.
"""
