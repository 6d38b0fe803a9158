"""One process of the multi-process scoring tests: runs each `betaprm` command given (a JSON
list of argument lists) in turn, as `torchrun -m betaprm CMD ...` would, in one process so
that torch loads once. Run by torchrun from test_multiprocess."""

import json
import sys

from betaprm.cli import main

if __name__ == "__main__":
    for argv in json.loads(sys.argv[1]):
        rc = main(argv)
        if rc:
            sys.exit(rc)
