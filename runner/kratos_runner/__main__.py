import sys

from kratos_runner.cli import main

sys.exit(main(sys.argv[1:]))
