"""`python -m studies.v2 <stage>`: see study.py."""

import sys

from studies.v2 import study

sys.exit(study.main())
