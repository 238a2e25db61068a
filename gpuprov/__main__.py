import sys

from gpuprov.cli import main

sys.exit(main())
