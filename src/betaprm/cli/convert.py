"""betaprm convert"""

HELP = "convert public PRM data (VisualPRM raw, Math-Shepherd, PRM800K, TRL) to betaprm records"
DESCRIPTION = """Convert a public PRM data file to betaprm's record format, keeping the counts.

  visualprm-raw  VisualPRM400K(-v1.1)-Raw annotations: K, N = num_mc_correct, num_mc_total
  math-shepherd  'input' tagged with 'ки', 'label' with +/-: hard labels (N = 1)
  prm800k        PRM800K phase files: ratings 1/0/-1 as hard labels; --prm800k-neutral
                 says whether 0 counts as correct (default) or not
  trl            TRL stepwise (prompt, completions, labels): booleans are hard labels;
                 fractional labels need --soft-n N and become K = p*N of N, never rounded

Input is JSONL (or .json list, or .parquet with pyarrow). Every output record is
validated; bad input lines stop the run (exit 2) or, with --on-error skip, go to the
rejects file with their reasons."""


def add_arguments(parser):
    from ..data.convert import FORMATS

    parser.add_argument("--from", dest="fmt", required=True, choices=FORMATS, help="the input format")
    parser.add_argument("--input", required=True, help="the file to convert")
    parser.add_argument("--output", required=True, help="where to write betaprm records (JSONL)")
    parser.add_argument(
        "--on-error",
        choices=["fail", "skip"],
        default="fail",
        help="fail (default): stop on any bad record; skip: leave bad records out and write them to --rejects",
    )
    parser.add_argument("--rejects", help="rejects file for --on-error skip (default: OUTPUT with .rejects.jsonl)")
    parser.add_argument(
        "--source-name", help="source name used in generated ids and the source field (default: the input file's stem)"
    )
    parser.add_argument(
        "--image-root", help="visualprm-raw: folder that image paths are relative to (prefixed to them)"
    )
    parser.add_argument(
        "--prm800k-neutral",
        choices=["correct", "incorrect"],
        default="correct",
        help="prm800k: how a 0 (neutral) rating counts (default: correct)",
    )
    parser.add_argument("--soft-n", type=int, help="trl: N for fractional labels (K = p*N)")


def run(args):
    from pathlib import Path

    from ..data.convert import ConvertOptions, convert_file
    from ..errors import BetaPRMInputError

    if args.soft_n is not None and not 1 <= args.soft_n <= 2**24:
        raise BetaPRMInputError(
            f"--soft-n must be in [1, 16777216] (counts are exact in float32 up to 2**24), got {args.soft_n}"
        )
    opts = ConvertOptions(
        source_name=args.source_name or Path(args.input).stem,
        image_root=args.image_root,
        neutral_correct=args.prm800k_neutral == "correct",
        soft_n=args.soft_n,
    )
    rejects = args.rejects or str(Path(args.output).with_suffix("")) + ".rejects.jsonl"
    stats = convert_file(args.fmt, args.input, args.output, opts, on_error=args.on_error, rejects=rejects)
    msg = (
        f"{args.input} ({args.fmt}): {stats['read']} read, {stats['written']} records with {stats['steps']} steps "
        f"written to {args.output}"
    )
    if stats["rejected"]:
        msg += f", {stats['rejected']} rejected (see {rejects})"
    print(msg)
    return 0
