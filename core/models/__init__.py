"""The models we run: the registry and ``load(name | hub id | folder) -> Loaded`` (see :mod:`core.models.loading`).

Step 1 of splitting the former ``core/models.py`` by concern (issue 46): the module moved unchanged to
``loading.py`` so that its history follows; this package re-exports its public names.
"""

from core.models.loading import *  # noqa: F401,F403
