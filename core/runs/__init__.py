"""Running a model on a document with a chosen temperature: :func:`core.runs.engine.run`, the temperature
methods' registry and their maths, Algorithm 1's passes (calibration), the settings file, time estimates, and
:func:`core.runs.apply.apply` for a model you already hold. (``core.engine`` and ``core.apply`` stay importable
under their old names: the same module objects.)
"""
