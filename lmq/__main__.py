import sys

from lmq.cli import main

sys.exit(main())
