"""``python -m layerfit.cli``: the ``layerfit`` command."""

import sys

from layerfit.cli import main

sys.exit(main())
