"""python -m mlx_fp4: the mlx-fp4 command line (convert / generate / bench)."""

import sys

from .cli import main

sys.exit(main())
