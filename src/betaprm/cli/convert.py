"""betaprm convert"""

from pathlib import Path

from ..data.convert import FORMATS, ConvertOptions, convert_file
from ..errors import BetaPRMInputError
from ..provenance import check_paths
from .flags import expand_path, number_flag

HELP = "convert public PRM data (VisualPRM raw, Math-Shepherd, PRM800K, TRL, the authors' files) to betaprm records"
DESCRIPTION = """Convert a public PRM data file to betaprm's record format, keeping the counts.

  visualprm-raw  VisualPRM400K(-v1.1)-Raw annotations: K, N = num_mc_correct, num_mc_total
  math-shepherd  'input' tagged with 'ки', 'label' with +/-: hard labels (N = 1)
  prm800k        PRM800K phase files: ratings 1/0/-1 as hard labels; --prm800k-neutral
                 says whether 0 counts as correct (default) or not
  trl            TRL stepwise (prompt, completions, labels): booleans are hard labels;
                 fractional labels need --soft-n N and become K = p*N of N, never rounded
  mc-prefix      one row per solution prefix with its Monte Carlo success rate (the
                 PRM-calibration data: question, reasoning_prefix, success_prob): needs
                 --mc-n N (rollouts per prefix); K = round(N*rate), refused if not whole;
                 the rows of one solution (question, and response_id if present) become
                 one record, every step labelled by its own prefix's row
  er-prm         ER-PRM soft labels (text with 'ки' after each step, value per step):
                 needs --soft-n N (ER-PRM used 16); K = p*N; --er-eta ETA recovers p from
                 the entropy-regularised value v = log(1 - p + p*e^ETA)/ETA
  authors-train  the paper authors' training JSONL (InternVL conversations: 'Question: Q
                 \\nProcess: s1<prm>s2<prm>', the gpt turn's ratio per step, prm_counts
                 {k, n}); where prm_counts is missing, their loader's rule: N = 16,
                 K = round(16*ratio), said in each record's meta and in the summary;
                 images under --image-root (their meta json's root)
  authors-pool   the authors' Best-of-N annotation file (JSON list: question,
                 image_path/image, solutions_splits, labels) -> pool records, each
                 candidate's 'correct' from labels; their scores (prm_mu, prm_kappa,
                 prm_sigma) kept when present; images found as their evaluators find
                 them (--image-root: their evaluator's root)

Hard labels (N = 1) train a standard PRM; a BetaPRM's kappa learns nothing from them, and
the summary says so (get counts with `betaprm label`).

Input is JSONL, a .json list, parquet, a save_to_disk folder or a hub name (NAME[:SPLIT]). Every output record is
validated; bad input lines stop the run (exit 2) or, with --on-error skip, go to the
rejects file with their reasons."""


def add_arguments(parser):
    parser.add_argument("--from", dest="fmt", required=True, choices=FORMATS, help="the input format")
    parser.add_argument(
        "--input",
        required=True,
        type=expand_path,
        help="the data to convert: JSONL, .json, parquet, a save_to_disk folder or a hub name (NAME[:SPLIT])",
    )
    parser.add_argument("--output", required=True, type=expand_path, help="where to write betaprm records (JSONL)")
    parser.add_argument(
        "--on-error",
        choices=["fail", "skip"],
        default="fail",
        help="fail (default): stop on any bad record; skip: leave bad records out and write them to --rejects",
    )
    parser.add_argument(
        "--rejects", type=expand_path, help="rejects file for --on-error skip (default: OUTPUT with .rejects.jsonl)"
    )
    parser.add_argument(
        "--source-name", help="source name used in generated ids and the source field (default: the input file's stem)"
    )
    parser.add_argument(
        "--image-root",
        type=expand_path,
        help="visualprm-raw, authors-train, authors-pool: folder that image paths are relative to (their meta "
        "json's or evaluator's root); paths under it are written absolute",
    )
    parser.add_argument(
        "--prm800k-neutral",
        choices=["correct", "incorrect"],
        default="correct",
        help="prm800k: how a 0 (neutral) rating counts (default: correct)",
    )
    parser.add_argument(
        "--soft-n", type=number_flag(integer=True), help="trl, er-prm: N for fractional labels (K = p*N)"
    )
    parser.add_argument(
        "--mc-n",
        type=number_flag(integer=True),
        help="mc-prefix: the rollouts behind each success rate (K = round(N*rate))",
    )
    parser.add_argument(
        "--er-eta", type=number_flag(), help="er-prm: the entropy coefficient of the labels; p is recovered from them"
    )


def run(args):
    if args.soft_n is not None and not 1 <= args.soft_n <= 2**24:
        raise BetaPRMInputError(
            f"--soft-n must be in [1, 16777216] (counts are exact in float32 up to 2**24), got {args.soft_n}"
        )
    if args.fmt == "mc-prefix" and not (args.mc_n and args.mc_n >= 1):
        raise BetaPRMInputError("--from mc-prefix needs --mc-n N (>= 1): the rollouts behind each success rate")
    if args.fmt == "er-prm" and args.soft_n is None:
        raise BetaPRMInputError("--from er-prm needs --soft-n N: the rollouts each soft label was computed from")
    if args.er_eta is not None and (args.fmt != "er-prm" or args.er_eta <= 0):
        raise BetaPRMInputError("--er-eta is for --from er-prm and must be > 0")
    opts = ConvertOptions(
        source_name=args.source_name or Path(args.input).stem,
        image_root=args.image_root,
        neutral_correct=args.prm800k_neutral == "correct",
        soft_n=args.soft_n,
        mc_n=args.mc_n,
        er_eta=args.er_eta,
    )
    rejects = args.rejects or str(Path(args.output).with_suffix("")) + ".rejects.jsonl"
    check_paths(
        [("--input", args.input)],
        [("--output", args.output), ("--rejects", rejects if args.on_error == "skip" else None)],
    )
    stats = convert_file(args.fmt, args.input, args.output, opts, on_error=args.on_error, rejects=rejects)
    if args.fmt == "authors-pool":
        msg = (
            f"{args.input} ({args.fmt}): {stats['read']} read, {stats['written']} pools with {stats['candidates']} "
            f"candidates written to {args.output}"
        )
        if stats["rejected"]:
            msg += f", {stats['rejected']} rejected (see {rejects})"
        print(msg)
        _images_note(stats)
        return 0
    msg = (
        f"{args.input} ({args.fmt}): {stats['read']} read, {stats['written']} records with {stats['steps']} steps "
        f"written to {args.output}"
    )
    if stats["rejected"]:
        msg += f", {stats['rejected']} rejected (see {rejects})"
    print(msg)
    if stats["hard_labels"]:
        print(
            "these are hard labels (N = 1 per step): train a standard PRM on them (--objective soft-ce or hard-ce); "
            "a BetaPRM's kappa learns nothing from single outcomes; counts with N > 1 come from `betaprm label`"
        )
    if stats["er_values_as_rates"]:
        print(
            "er-prm without --er-eta: each label is taken as the success rate p itself; ER-PRM's labels are "
            "entropy-regularised values v >= p, so pass --er-eta (the coefficient they were made with) to recover p"
        )
    if stats["soft"] and not stats["hard_labels"]:
        print('soft counts: K = p*N is fractional ("soft": true), never rounded')
    if args.fmt == "authors-train":
        print(
            f"counts: {stats['written'] - stats['counts_fallback']} records from prm_counts, "
            f"{stats['counts_fallback']} from the N = 16 fallback (K = round(16*ratio), their loader's rule; "
            '"meta": {"counts": "n16-fallback"})'
            + (
                f"; {stats['ratios_rounded']} of their ratios were not whole sixteenths and were rounded "
                '(half to even, as their loader does; "rounded_steps" in meta)'
                if stats["ratios_rounded"]
                else ""
            )
        )
        _images_note(stats)
    return 0


def _images_note(stats):
    if stats["images_missing"]:
        print(
            f"{stats['images_missing']} image paths name no file on this machine (`betaprm validate` lists them); "
            "--image-root names the folder they are relative to (their meta json's or evaluator's root)"
        )
