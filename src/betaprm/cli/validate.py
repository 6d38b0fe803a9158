"""betaprm validate"""

from ..data.records import validate_file
from .flags import expand_path

HELP = "check a records file and report every problem (exit 0 when clean, 2 otherwise)"
DESCRIPTION = """Check records (a JSONL file, or any source --data takes) without training on them.

Counts records (--kind counts, the default) need id, question, steps, mc_correct (K per
step) and mc_total (N per step or one N); pool records (--kind pool) need id, question
and candidates. Every problem is listed with file, line, field and the fix. Exit status
0 when the file is clean, 2 otherwise."""


def add_arguments(parser):
    parser.add_argument(
        "file",
        type=expand_path,
        help="the records to check: JSONL, .json, parquet, a save_to_disk folder or a hub name (NAME[:SPLIT])",
    )
    parser.add_argument(
        "--kind",
        choices=["counts", "pool"],
        default="counts",
        help="counts: training records; pool: candidate pools (default: counts)",
    )
    parser.add_argument(
        "--marker", default="<prm>", help="the step marker that may not appear in the text (default: <prm>)"
    )


def run(args):
    res, report = validate_file(args.file, kind=args.kind, marker=args.marker)
    print(report)
    return 0 if res.n_rejected == 0 else 2
