"""``python -m ferrymq.pipeline archive|replay ...``: the pipeline jobs (see jobs.py)."""

import sys

from ferrymq.pipeline.jobs import main

sys.exit(main())
