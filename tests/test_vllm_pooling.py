"""A BetaPRM's mean mu through vLLM's own step pooling (docs/scoring.md): vLLM's pooler
formulas, re-implemented here from the source of vLLM 0.33.0 (read from its wheel, not
imported: no vLLM on the test machines), on a tiny BetaPRM's hidden states and logits,
against `betaprm score`'s mu at each marker.

The files read: ``vllm/model_executor/layers/pooler/tokwise/methods.py`` (``StepPool``: the
rows at ``step_tag_id`` tokens, then the ``returned_token_ids`` columns, of what the model
returns), ``.../tokwise/heads.py`` (``TokenClassifierPoolerHead``: classifier, then the
activation), ``.../pooler/activations.py`` (``PoolerClassify``: sigmoid for one label,
softmax for more), ``vllm/model_executor/models/adapters.py``
(``load_weights_using_from_2_way_softmax``: the classifier's weight is the LM head's row of
``classifier_from_token[1]`` less that of ``classifier_from_token[0]``; a converted
``*ForCausalLM`` keeps no LM head)."""

import json

import numpy as np
import torch

from betaprm import BetaPRM
from betaprm.cli import main
from betaprm.formatting import encode_traces

from .test_serve import prm_dir  # noqa: F401  (the tiny BetaPRM, a module fixture)

TRACES = [
    ("what is 3 + 4 ?", ["3 + 4 = 7", "so the answer is 7"]),
    ("compute 12 * 3", ["12 * 3 = 36"]),
    ("add 1 and 2", ["1 + 2 = 3", "3 + 0 = 3", "the answer is 3"]),
]


def betaprm_score_mu(model_dir, tmp_path) -> list[np.ndarray]:
    """`betaprm score`'s mu per step, for TRACES."""
    pools = tmp_path / "pools.jsonl"
    pools.write_text(
        "".join(
            json.dumps({"id": f"p{i}", "question": q, "candidates": [{"steps": s}]}) + "\n"
            for i, (q, s) in enumerate(TRACES)
        )
    )
    assert (
        main(
            [
                "score",
                "--model",
                str(model_dir),
                "--input",
                str(pools),
                "--output",
                str(tmp_path / "out.jsonl"),
                "--device",
                "cpu",
            ]
        )
        == 0
    )
    rows = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    return [np.array(r["candidates"][0]["mu"]) for r in sorted(rows, key=lambda r: r["id"])]


def step_rows(ids: torch.Tensor, data: torch.Tensor, step_tag_id: int) -> torch.Tensor:
    """StepPool's selection: the rows of ``data`` at the positions holding ``step_tag_id``."""
    return data[(ids == step_tag_id).nonzero(as_tuple=True)[0]]


@torch.no_grad()
def test_vllm_step_pooling_gives_betaprm_scores_mu(prm_dir, tmp_path):  # noqa: F811
    """vLLM 0.33.0's recipe for a BetaPRM (``--convert classify``, ``classifier_from_token``
    [No, Yes] with ``method: from_2_way_softmax``, STEP pooling at the marker, task
    ``token_classify``) returns one value per marker, sigmoid(h . (W_Yes - W_No)), which is
    `betaprm score`'s mu; and a pooler that sees full-vocabulary logits (softmax over the
    vocabulary at each marker, then the probabilities of returned_token_ids [Yes, No]) gives
    two probabilities whose ratio p_Yes / (p_Yes + p_No) is mu, while p_Yes alone is not."""
    prm = BetaPRM.from_pretrained(prm_dir).eval()
    tok, cfg = prm.tokenizer, prm.config
    yes_id, no_id = cfg.reward_token_ids
    # What --hf-overrides names: vocabulary entries, read back by vLLM with convert_tokens_to_ids.
    no_tok, yes_tok = tok.convert_ids_to_tokens([no_id, yes_id])
    assert tok.convert_tokens_to_ids([no_tok, yes_tok]) == [no_id, yes_id]
    head = prm.backbone.get_output_embeddings()
    assert getattr(head, "bias", None) is None  # a bias-free LM head: the recipe is exact
    score_weight = head.weight[[yes_id]].float() - head.weight[[no_id]].float()  # (1, H), from_2_way_softmax
    want = betaprm_score_mu(prm_dir, tmp_path)
    for ids, mu in zip(encode_traces(tok, cfg.marker_id, TRACES, cfg.trace_format), want):
        ids = torch.tensor([ids])
        hidden = prm.backbone.get_decoder()(input_ids=ids).last_hidden_state[0]  # the LM head removed
        pooled = step_rows(ids[0], hidden, cfg.marker_id)  # STEP, no returned_token_ids
        out = torch.sigmoid(pooled.float() @ score_weight.T)  # classifier, then sigmoid (one label)
        assert out.shape == (len(mu), 1)
        np.testing.assert_allclose(out[:, 0].numpy(), mu, atol=1e-6)
        # A pooler over the vocabulary's logits: softmax, then the [Yes, No] columns.
        logits = prm.backbone(input_ids=ids).logits[0]
        p = step_rows(ids[0], torch.softmax(logits.float(), dim=-1), cfg.marker_id)[:, [yes_id, no_id]]
        np.testing.assert_allclose((p[:, 0] / p.sum(-1)).numpy(), mu, atol=1e-6)
        assert (p.sum(-1) < 1 - 1e-3).all()  # the rest of the vocabulary keeps some mass: p_Yes is not mu
