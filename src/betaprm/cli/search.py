"""betaprm search"""

from __future__ import annotations

from dataclasses import dataclass, fields

from ..aca import summarize
from ..errors import BetaPRMInputError
from ..options import opt as _f
from ..search import SearchConfig, run_search
from .flags import add_config_args, config_from_args
from .problems import GenerationOptions, ProblemOptions, run_with_output, setup, summary_line
from .scoring_options import BatchOptions

HELP = "step-level beam search or DVTS guided by a PRM (optionally by its reliability)"
DESCRIPTION = """Beam search or DVTS (diverse verifier tree search, as search-and-learn defines them) with a
trained PRM scoring each new step: every round the generator writes one more step of each kept
beam and the PRM ranks them by the latest step's mu (--rank mu) or mu + c * sigma (--rank ucb).

Problems: the chain-arithmetic world's test split by default (the split `betaprm demo --seed S`
uses), or --problems FILE.jsonl with id, question and, for an accuracy, answer per line (checked
with math-verify; a line without answer gets its choice and no verdict). Generation: --backend
synth | transformers | openai | vllm. The synthetic policy and OpenAI-compatible servers stop
after one step (a blank line, --split blank-line); other backends write whole completions, of
which the search keeps the first step and pays for all.

Each problem appends one record to --out (the choice, generated tokens, rounds, with
--write-candidates the finished beams and their scores); rerunning the same command skips the
problems already there. OUT.meta.json records the settings that made the records."""


@dataclass
class SearchCommandConfig(ProblemOptions, SearchConfig, BatchOptions, GenerationOptions):
    write_candidates: bool = _f(False, "keep every finished beam's steps and scores in the records")

    def __post_init__(self):
        bad = self.problem_checks()
        try:
            SearchConfig.__post_init__(self)
        except BetaPRMInputError as e:
            bad.append(str(e))
        if bad:
            raise BetaPRMInputError("bad search configuration:\n  " + "\n  ".join(bad))

    def search_config(self) -> SearchConfig:
        return SearchConfig(**{f.name: getattr(self, f.name) for f in fields(SearchConfig)})


def add_arguments(parser):
    add_config_args(parser, SearchCommandConfig)


def run(args):
    return run_with_output(config_from_args(SearchCommandConfig, args), _run)


def _run(cfg):
    r = setup(cfg)
    records = run_search(
        r.tasks,
        r.generator,
        r.scorer,
        cfg.search_config(),
        r.answer_of,
        r.is_correct,
        write_candidates=cfg.write_candidates,
        out=cfg.out,
        procs=r.procs,
    )
    r.close()
    if not r.procs.main:  # under torchrun: rank 0 has every record, and reports
        return 0
    print(summary_line(cfg.method, summarize(records), cfg.out))
    return 0
