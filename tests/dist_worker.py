"""One rank of the two-process CPU (gloo) training test: trains, then writes a digest
of its parameters, its view of the world size and (with held-out data) its evaluations.
Run by torchrun from test_distributed."""

import hashlib
import json
import os
import sys
from pathlib import Path

from betaprm.train import dataset, end_process_group, train
from tests.helpers import train_config  # the repository root is on PYTHONPATH (test_distributed)


def main():
    lm, data, out = sys.argv[1:4]
    tokens = int(sys.argv[4]) if len(sys.argv) > 4 else 0
    # Held-out counts records: evaluate every 2 steps and end with the best checkpoint.
    eval_data = sys.argv[5] if len(sys.argv) > 5 else ""
    seen = []  # the record indices of every batch this rank trained on
    collate = dataset.CountsCollator.__call__

    def spy(self, features):
        seen.append([f["index"] for f in features])
        return collate(self, features)

    dataset.CountsCollator.__call__ = spy
    kw = dict(
        global_batch_size=8,
        per_device_train_batch_size=2,
        max_steps=4,
        save_steps=100,
        ddp_backend="gloo",
        max_batch_tokens=tokens,
    )
    if eval_data:  # a high learning rate, so the best checkpoint is not always the last
        kw.update(eval_data=eval_data, eval_steps=2, save_steps=2, load_best_model_at_end=True, learning_rate=1e-1)
    cfg = train_config(lm, data, out, **kw)
    prm, trainer, _ = train(cfg)
    h = hashlib.sha256()
    for k, v in sorted(prm.state_dict().items()):
        h.update(k.encode())
        h.update(v.detach().float().contiguous().numpy().tobytes())
    rank = os.environ["RANK"]
    info = {
        "digest": h.hexdigest(),
        "world_size": trainer.args.world_size,
        "grad_accum": trainer.args.gradient_accumulation_steps,
        "kappa_bias": prm.kappa_head.bias.item(),
        "steps": trainer.state.global_step,
        "seen": seen,
        "evals": [
            {k: v for k, v in e.items() if k.startswith("eval_") and "per_second" not in k and "runtime" not in k}
            for e in trainer.state.log_history
            if "eval_nll" in e
        ],
        "best_metric": trainer.state.best_metric,
        "best_checkpoint": trainer.state.best_model_checkpoint,
    }
    Path(out, f"rank{rank}.json").write_text(json.dumps(info))
    end_process_group()  # as `betaprm train` does: no teardown race at exit


if __name__ == "__main__":
    main()
