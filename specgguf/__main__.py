"""`python -m specgguf` is the `specgguf` command."""

import sys

from .cli import main

sys.exit(main())
