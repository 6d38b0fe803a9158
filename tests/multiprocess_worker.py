"""One process of the multi-process tests, as `torchrun -m betaprm CMD ...` would run it:
runs each `betaprm` command given (a JSON list of argument lists) in turn, in one process so
that torch loads once. Run by torchrun from test_multiprocess.

KILL_AFTER=K (every process) or K:RANK (that one only) kills the process (SIGKILL) once it
has appended K times to its part file: a run killed mid-way, with no hook in the library."""

import json
import os
import signal
import sys

from betaprm import distributed
from betaprm.cli import main


def _kill_after(spec: str) -> None:
    k, _, who = spec.partition(":")
    write = distributed.PartWriter.write

    def write_then_maybe_die(self, lines):
        write(self, lines)
        if self.writes == int(k) and (not who or int(who) == self.rank):
            os.kill(os.getpid(), signal.SIGKILL)

    distributed.PartWriter.write = write_then_maybe_die


if __name__ == "__main__":
    if os.environ.get("KILL_AFTER"):
        _kill_after(os.environ["KILL_AFTER"])
    for argv in json.loads(sys.argv[1]):
        rc = main(argv)
        if rc:
            sys.exit(rc)
