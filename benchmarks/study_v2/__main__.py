"""`python -m benchmarks.study_v2 <stage>`: see study.py."""

import sys

from benchmarks.study_v2 import study

sys.exit(study.main())
