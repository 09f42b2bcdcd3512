"""``core.engine``, kept where users import it: the same module object as :mod:`core.runs.engine`.

``from core import engine`` and ``import core.engine`` give :mod:`core.runs.engine` itself (not a copy), so
``engine.run(...)`` and anything set on the module act on the one engine.
"""

import sys

from core.runs import engine as _engine

sys.modules[__name__] = _engine
