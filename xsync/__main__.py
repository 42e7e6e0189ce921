import sys

from xsync.cli import main

sys.exit(main())
