"""What a run asks for, as checked values: the tau :class:`~core.values.schedule.Schedule`, the position
schemes (their registry, maths and the :class:`~core.values.positions.Scheme` value), the
:class:`~core.values.choice.Choice` that carries both to the attention, and the bounds every edge checks with.
Nothing here imports torch at import time, so the CLI can refuse a bad option before torch loads.
"""
