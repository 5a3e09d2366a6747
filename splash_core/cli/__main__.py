"""``python -m splash_core.cli``: the ``splash`` command where its console script is not on PATH
(as ``python -m splash_core.cli.main``)."""

import sys

from .main import main

sys.exit(main())
