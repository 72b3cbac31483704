"""``python -m differential`` (with test/ on sys.path) is ``python test/differential/run.py``."""

import sys

from differential.run import main

sys.exit(main())
