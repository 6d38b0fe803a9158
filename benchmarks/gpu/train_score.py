"""Train with ``betaprm.train.train`` (what ``betaprm train`` runs), then score records with
the model still in memory: launched by ``accelerate launch`` under each engine, so the
in-memory scores can be compared with the saved checkpoint loaded elsewhere.

    accelerate launch --config_file CFG benchmarks/gpu/train_score.py KWARGS.json EVAL.jsonl SCORES.json
"""

import json
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from common import read_jsonl, score_records, write_json  # noqa: E402

from betaprm.train import TrainConfig, train  # noqa: E402

kwargs = json.loads(Path(sys.argv[1]).read_text())
records = read_jsonl(sys.argv[2], 48)
t0 = time.perf_counter()
prm, trainer, _ = train(TrainConfig(**kwargs), quiet=True)
seconds = time.perf_counter() - t0
if trainer.args.process_index == 0:
    result = {
        "train_seconds": seconds,
        "bf16": trainer.args.bf16,
        "deepspeed": trainer.is_deepspeed_enabled,
        "fsdp": trainer.is_fsdp_enabled,
        "losses": [h["loss"] for h in trainer.state.log_history if "loss" in h],
        "peak_gpu_mib": torch.cuda.max_memory_allocated() / 2**20 if torch.cuda.is_available() else None,
    }
    try:
        prm.eval()
        with torch.no_grad():
            result["scores"] = score_records(prm, records)
    except Exception as e:  # the in-memory model under a sharding engine: say what happened
        result["score_error"] = "".join(traceback.format_exception_only(type(e), e)).strip()
    write_json(sys.argv[3], result)
