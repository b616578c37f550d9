"""`python -m gpt1` is the `gpt1` command."""

import sys

from gpt1.cli import main

sys.exit(main())
