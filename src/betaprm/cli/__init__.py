"""The ``betaprm`` command line: one thin module per subcommand."""

from __future__ import annotations

import argparse
import difflib
import logging
import sys

from ..errors import BetaPRMInputError, TrainingDivergedError
from ..generation.base import GenerationError
from ..progress import bars_scope
from ..provenance import version
from . import (
    aca,
    convert,
    convert_model,
    demo,
    eval_bon,
    eval_calibration,
    eval_steps,
    label,
    score,
    search,
    serve,
    train,
    validate,
)

COMMANDS = {
    "demo": demo,
    "train": train,
    "score": score,
    "validate": validate,
    "convert": convert,
    "convert-model": convert_model,
    "label": label,
    "aca": aca,
    "search": search,
    "eval-steps": eval_steps,
    "eval-bon": eval_bon,
    "eval-calibration": eval_calibration,
    "serve": serve,
}


class _Parser(argparse.ArgumentParser):
    """argparse's parser with its errors in one line: a command has some fifty flags, and a
    typo answered with the whole usage hides the one line that matters. An unknown flag
    names the closest real one."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

    def unknown(self, flags: list[str]):
        # The shown spellings (--learning-rate), not the hidden underscore ones.
        known = [s for s in self._option_string_actions if s.startswith("--") and "_" not in s]
        words, after_flag = [], False
        for flag in flags:
            if not flag.startswith("-") or _is_number(flag):
                if not after_flag:  # an unknown flag's value is part of it, not a second error
                    words.append(f"unexpected argument {flag!r}")
                after_flag = False
                continue
            name = flag.split("=", 1)[0]
            after_flag = "=" not in flag
            bare = name.lstrip("-").replace("_", "-")
            close = [k for k in known if bare in k] if len(bare) >= 4 else []
            close = close or difflib.get_close_matches("--" + bare, known, n=1, cutoff=0.75)
            words.append(f"unknown option {name}" + (f"; did you mean {close[0]}?" if close else ""))
        self.error("; ".join(words))


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="betaprm",
        description=(
            "Process reward models that report how reliable each step reward is: at every "
            "step marker a BetaPRM gives a Beta belief (mu, kappa) over the chance that the "
            "trace, continued from there, ends correct."
        ),
    )
    parser.add_argument("--version", action="version", version=f"betaprm {version()}")
    parser.add_argument("--debug", action="store_true", help="show Python tracebacks for input errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module in COMMANDS.items():
        p = sub.add_parser(
            name,
            help=module.HELP,
            description=module.DESCRIPTION,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        p.add_argument(
            "--debug", action="store_true", default=argparse.SUPPRESS, help="show Python tracebacks for input errors"
        )
        module.add_arguments(p)
        p.set_defaults(_run=module.run, _parser=p)
    return parser


class _ConsoleHandler(logging.Handler):
    """The library's log lines (the ``betaprm`` loggers) as plain lines: progress (INFO) on
    stdout, warnings on stderr; the streams are looked up at each record (tests swap them)."""

    def emit(self, record):
        stream = sys.stderr if record.levelno >= logging.WARNING else sys.stdout
        stream.write(self.format(record) + "\n")
        stream.flush()


def _configure_logging() -> None:
    root = logging.getLogger("betaprm")
    if not any(isinstance(h, _ConsoleHandler) for h in root.handlers):
        handler = _ConsoleHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        root.addHandler(handler)
    root.setLevel(logging.INFO)
    root.propagate = False


def main(argv=None) -> int:
    _configure_logging()
    parser = build_parser()
    # A subcommand's unknown flag (a typo) is reported by that subcommand's parser: its usage
    # line, not the top-level one.
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        getattr(args, "_parser", parser).unknown(unknown)
    if not getattr(args, "command", None):
        parser.print_help()
        return 2
    try:
        with bars_scope():  # --disable-tqdm lasts as long as its command
            return args._run(args) or 0
    except BetaPRMInputError as e:
        if args.debug:
            raise
        print(f"betaprm {args.command}: error: {e}", file=sys.stderr)
        return 2
    except GenerationError as e:
        if args.debug:
            raise
        print(f"betaprm {args.command}: generation failed: {e}", file=sys.stderr)
        return 1
    except TrainingDivergedError as e:
        if args.debug:
            raise
        print(f"betaprm {args.command}: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
