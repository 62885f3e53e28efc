"""`python -m kernelloop` is the `kernelloop` command."""

import sys

from kernelloop.cli import main

sys.exit(main())
