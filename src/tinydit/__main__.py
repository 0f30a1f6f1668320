"""``python -m tinydit`` is the same as the ``tinydit`` command."""

import sys

from tinydit.cli import main

sys.exit(main())
