"""`python -m gradleak.cli ARGS`, as the `gradleak` command."""

import sys

from . import main

sys.exit(main())
