import sys

from extproc.commands.cli import main

sys.exit(main())
