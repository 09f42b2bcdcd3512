"""The attention mechanics every model family runs through: the one attention function registered with
transformers (:mod:`~core.mechanics.attention`), its softmax block and backends (:mod:`~core.mechanics.softmax_block`,
the CPU kernel :mod:`~core.mechanics.fused_softmax`), T5's relative bias as one vector per head, and the probes
that record Pmax, entropy and maps block by block. (How a position scheme reaches a pass of a loaded model is
:mod:`core.runs.rope_pass`, one floor up: it needs the model.)
"""
