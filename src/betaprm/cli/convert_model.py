"""betaprm convert-model"""

from ..authors_checkpoint import convert_authors_checkpoint
from .flags import expand_path, number_flag

FORMATS = ("authors",)

HELP = "convert a PRM checkpoint saved by other code (the paper authors') into a BetaPRM folder"
DESCRIPTION = """Convert a PRM checkpoint saved by other code into a BetaPRM folder that every betaprm command loads.

  authors   a checkpoint of the paper authors' training code (github.com/JinYuanLi0012/
            Beta-Binomial-PRM): an InternVL chat model folder (config.json of
            InternVLChatModel, safetensors with vision_model.*, mlp1.*, language_model.* and
            kappa_head.*, the tokenizer with <prm>). The backbone becomes transformers'
            InternVLForConditionalGeneration, the kappa head their LayerNorm -> Linear
            (kappa_head layernorm-linear), and traces are written as their scoring writes them
            (their conversation template, an empty user turn, "Question: ...\\nProcess: ..."),
            so mu and kappa are theirs. Qwen2, Llama and InternLM2 language models (InternLM2
            becomes Llama; its sentencepiece tokenizer.model is rebuilt as a fast tokenizer, and
            one whose encoding cannot be rebuilt exactly is refused).

The input folder is only read; --output must be a new or empty folder outside it."""


def add_arguments(parser):
    parser.add_argument("--from", dest="fmt", required=True, choices=FORMATS, help="whose checkpoint it is")
    parser.add_argument(
        "--input", required=True, type=expand_path, help="the checkpoint folder (config.json, safetensors, tokenizer)"
    )
    parser.add_argument("--output", required=True, type=expand_path, help="the BetaPRM folder to write (new or empty)")
    parser.add_argument(
        "--kappa-min",
        type=number_flag(low=0),
        default=1e-3,
        help="the floor added to softplus: 1e-3 in the authors' model class, which their scoring uses (default: 1e-3)",
    )


def run(args):
    summary = convert_authors_checkpoint(args.input, args.output, kappa_min=args.kappa_min)
    added = f"; added token {', '.join(summary['added_tokens'])} for the processor" if summary["added_tokens"] else ""
    print(
        f"{args.input} ({args.fmt}): {summary['language_model']}, template {summary['template']}, "
        f"{summary['parameters']:,} parameters ({summary['dtype']}), {summary['image_tokens_per_tile']} image tokens "
        f"per tile{added}; BetaPRM written to {args.output}"
    )
    return 0
