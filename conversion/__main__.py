"""`python -m posformers.conversion`: the same as the `posformers-convert` command."""

import sys

from posformers.conversion.cli import main

sys.exit(main())
