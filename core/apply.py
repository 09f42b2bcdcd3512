"""``core.apply``, kept where users import it: the same module object as :mod:`core.runs.apply`.

``from core.apply import apply, install, uninstall`` and ``from core import apply`` give :mod:`core.runs.apply`
itself (not a copy).
"""

import sys

from core.runs import apply as _apply

sys.modules[__name__] = _apply
