"""``BetaPRM``: a process reward model with a Beta belief at every step marker.

At each marker position the backbone's hidden state ``h`` gives

- ``mu    = softmax(z_Yes, z_No)[Yes]`` from the two reward-token rows of the output
  embedding only (never the full-vocabulary logits of every position), and
- ``kappa = softplus(g(h)) + kappa_min`` from a small head ``g``: a linear map initialised so
  that ``kappa == kappa_init`` before training, or (``kappa_head="layernorm-linear"``) the paper
  authors' LayerNorm before it, initialised as theirs (``kappa`` near ``kappa_init``).

Checkpoints are Hugging Face directories: the backbone and tokenizer as transformers
writes them (safetensors), ``kappa_head.safetensors``, and ``betaprm_config.json``.

Over 400 lines because creation (marker token, reward rows, vision-language backbones),
the forward pass and loading with its checks are one contract: what ``save_pretrained``
writes, ``from_pretrained`` verifies, and ``model_kind`` / ``load_prm`` read back (which kind
of model a folder holds is decided by the same ``betaprm_config.json``).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

from .card import write_model_card
from .data.jsonl import BadJSON, decode_utf8, load_json_file, loads_strict
from .errors import BetaPRMInputError
from .formatting import DEFAULT_TEMPLATE, TraceFormat
from .hub import ModelSource, resolve_model, unreadable_model
from .options import KAPPA_HEADS
from .provenance import version
from .scoring import score_traces
from .vision import is_vision_config, load_processor, processor_kwargs

__all__ = ["BetaPRM", "BetaPRMConfig", "BetaPRMOutput", "load_prm", "model_kind"]

CONFIG_NAME = "betaprm_config.json"
HEAD_NAME = "kappa_head.safetensors"


@dataclass
class BetaPRMConfig:
    """Everything besides the backbone that defines a BetaPRM (saved as JSON)."""

    marker: str = "<prm>"
    reward_tokens: tuple[str, str] = ("Yes", "No")
    kappa_init: float = 4.0
    kappa_min: float = 1e-3
    # The kappa head's form (betaprm.options.KAPPA_HEADS); checkpoints of older versions,
    # without the key, have the linear head.
    kappa_head: str = "linear"
    template: str = DEFAULT_TEMPLATE
    step_separator: str = ""
    chat_template: bool = False
    marker_repeat: int = 1
    # Resolved against the tokenizer at creation and checked again at load time.
    marker_id: int = -1
    reward_token_ids: tuple[int, int] = (-1, -1)
    auto_class: str = "AutoModelForCausalLM"
    # The tokenizer class and the ids it gives a probe text at save time: transformers 5
    # may pick another tokenizer class from config.json's model_type on reload (a
    # Qwen2 backbone gets Qwen2Tokenizer, which splits digits), so the class is pinned
    # and the probe proves the reloaded tokenizer still tokenises the same way.
    tokenizer_class: str = ""
    tokenizer_probe_ids: list[int] = field(default_factory=list)
    # Vision-language backbones: the processor class and its own settings (the image
    # processor's are in preprocessor_config.json beside the weights).
    processor_class: str = ""
    processor_kwargs: dict = field(default_factory=dict)
    # The training objective (set by ``betaprm train``): beta-binomial makes a BetaPRM whose
    # kappa was trained, any other a standard PRM. Empty in checkpoints of older versions,
    # whose objective is in their train_summary.json.
    objective: str = ""
    # The hub name of the backbone the model was made from (empty for a local folder): the
    # model card's base_model.
    base_model: str = ""
    betaprm_version: str = field(default_factory=version)

    def __post_init__(self):
        self.reward_tokens = tuple(self.reward_tokens)
        self.reward_token_ids = tuple(self.reward_token_ids)
        problems = []
        if len(self.reward_tokens) != 2 or self.reward_tokens[0] == self.reward_tokens[1]:
            problems.append(f"reward_tokens must be two different strings, got {self.reward_tokens!r}")
        if not self.kappa_min >= 0:
            problems.append(f"kappa_min must be >= 0, got {self.kappa_min}")
        if not self.kappa_init > self.kappa_min:
            problems.append(f"kappa_init must exceed kappa_min ({self.kappa_min}), got {self.kappa_init}")
        if self.kappa_head not in KAPPA_HEADS:
            problems.append(f"kappa_head must be one of {', '.join(KAPPA_HEADS)}, got {self.kappa_head!r}")
        if problems:
            raise BetaPRMInputError("; ".join(problems))

    # The Trainer's logging integrations (TensorBoard, W&B) record model.config with these.
    def to_dict(self) -> dict:
        return asdict(self)

    def to_json_string(self) -> str:
        return json.dumps(asdict(self), indent=2) + "\n"

    @property
    def trace_format(self) -> TraceFormat:
        return TraceFormat(self.template, self.marker, self.step_separator, self.chat_template, self.marker_repeat)


@dataclass
class BetaPRMOutput:
    """Per-marker outputs, flattened over the batch in row-major (row, position) order.

    ``reward_logits``: (M, 2) float32 ``[z_Yes, z_No]``; ``mu``, ``kappa``: (M,) float32;
    ``row``: (M,) long, the batch row each marker came from.
    """

    reward_logits: torch.Tensor
    mu: torch.Tensor
    kappa: torch.Tensor
    row: torch.Tensor
    hidden_states: torch.Tensor | None = None
    """(B, S, H) last hidden states, only with ``forward(..., return_hidden=True)``."""

    @property
    def sigma(self) -> torch.Tensor:
        return torch.sqrt(self.mu * (1.0 - self.mu) / (self.kappa + 1.0))


def _inverse_softplus(y: float) -> float:
    return y + math.log(-math.expm1(-y))


# Digits, spaces, unicode, LaTeX and the reward words: what tokenizers disagree on.
_PROBE_TEXT = "Question: 12 + 345 = 357? Yes No yes no  \\frac{1}{2} Ünïcödé 温度 π≈3.14\n\tdone."


def _probe_ids(tokenizer) -> list[int]:
    return list(tokenizer.encode(_PROBE_TEXT, add_special_tokens=False))


def _single_token_id(tokenizer, word: str, role: str) -> int:
    ids = tokenizer.encode(word, add_special_tokens=False)
    if len(ids) != 1:
        pieces = tokenizer.convert_ids_to_tokens(ids)
        raise BetaPRMInputError(
            f"the {role} {word!r} is not a single token for this tokenizer: it encodes to {ids} "
            f"({pieces}). mu is read from one logit per reward word, so pass reward_tokens= two "
            "words that are single tokens (try a leading space, e.g. (' Yes', ' No'), or "
            "('+', '-'))."
        )
    return ids[0]


class KappaHead(nn.Linear):
    """The kappa head g: a float32 ``nn.Linear(H, 1)`` whose output is float32 whatever
    the engine did to its weight. DeepSpeed's bf16 mode and FSDP2's mixed precision hand
    the forward a bf16 weight; the input follows the weight's dtype at call time (read
    inside this module's own forward, where ZeRO-3 has gathered the weight)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.to(self.weight.dtype)).float()


class LayerNormKappaHead(nn.Sequential):
    """The paper authors' kappa head: ``LayerNorm(H, eps=1e-5) -> Linear(H, 1)``, here in float32
    (theirs ran in the model's dtype, bf16 in their training and scoring). Its state keys are
    theirs without the ``kappa_head.`` prefix: ``0.*`` the LayerNorm, ``1.*`` the linear map.
    Input and output dtypes as ``KappaHead``."""

    def __init__(self, hidden: int, dtype=torch.float32):
        super().__init__(nn.LayerNorm(hidden, eps=1e-5, dtype=dtype), nn.Linear(hidden, 1, dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.to(self[0].weight.dtype)).float()


def make_kappa_head(kind: str, hidden: int) -> nn.Module:
    """An uninitialised float32 kappa head of the form ``kind`` (``KAPPA_HEADS``) on ``hidden`` features."""
    if kind == "linear":
        return KappaHead(hidden, 1, dtype=torch.float32)
    if kind == "layernorm-linear":
        return LayerNormKappaHead(hidden)
    raise BetaPRMInputError(f"kappa_head must be one of {', '.join(KAPPA_HEADS)}, got {kind!r}")


def init_kappa_head(head: nn.Module, config: BetaPRMConfig) -> None:
    """A new head's start: the bias gives ``kappa_init`` (softplus(b) + kappa_min); the linear
    weights are zero (``linear``: every marker starts at ``kappa_init``) or, for the authors'
    ``layernorm-linear``, drawn from N(0, 1e-3) as theirs (the LayerNorm at its identity start)."""
    linear = head[-1] if isinstance(head, nn.Sequential) else head
    with torch.no_grad():
        if config.kappa_head == "layernorm-linear":
            linear.weight.normal_(mean=0.0, std=1e-3)
        else:
            linear.weight.zero_()
        linear.bias.fill_(_inverse_softplus(config.kappa_init - config.kappa_min))


class BetaPRM(nn.Module):
    """A causal-LM backbone plus a kappa head; see the module docstring."""

    def __init__(
        self,
        backbone: nn.Module,
        tokenizer,
        config: BetaPRMConfig,
        kappa_head: nn.Module | None = None,
        processor=None,
    ):
        super().__init__()
        self.backbone = backbone
        self.tokenizer = tokenizer
        self.config = config
        self.processor = processor  # vision-language backbones only (betaprm.vision)
        hidden = _hidden_size(backbone)
        if kappa_head is None:
            # Initialised once, here, at creation: never again at train start or resume
            # (the authors' code re-initialised it on every start, wiping a trained head).
            kappa_head = make_kappa_head(config.kappa_head, hidden)
            init_kappa_head(kappa_head, config)
        self.kappa_head = kappa_head.to(device=_device_of(backbone), dtype=torch.float32)

    @property
    def _no_split_modules(self):
        """The backbone's decoder-layer classes: FSDP's transformer auto-wrap policy
        (accelerate reads this attribute) shards layer by layer, not the model whole."""
        return getattr(self.backbone, "_no_split_modules", None)

    # ------------------------------------------------------------------ creation
    @classmethod
    def from_backbone(
        cls,
        model_or_path,
        tokenizer=None,
        marker: str = "<prm>",
        reward_tokens: Sequence[str] = ("Yes", "No"),
        kappa_init: float = 4.0,
        kappa_min: float = 1e-3,
        *,
        kappa_head: str = "linear",
        template: str = DEFAULT_TEMPLATE,
        step_separator: str = "",
        chat_template: bool = False,
        marker_repeat: int = 1,
        trust_remote_code: bool = False,
        dtype=None,
        processor=None,
        attn_implementation: str | None = None,
    ) -> BetaPRM:
        """Wrap a causal LM or a vision-language model (an instance, or a local
        directory / hub id / resolved ``ModelSource``) as a BetaPRM. Files that cannot be read
        (no weights, a truncated file, a partial hub snapshot) are a ``BetaPRMInputError``
        naming the folder and the fix.

        Adds ``marker`` as a special token when the tokenizer lacks it (new embedding
        rows set to the mean of the existing ones) and resolves the two reward words to
        single token ids. A vision-language model (its config has a ``vision_config``)
        loads as ``AutoModelForImageTextToText`` with its processor (an instance needs
        ``processor=``, whose tokenizer is then the tokenizer). ``attn_implementation``
        (eager, sdpa, flash_attention_2, ...) goes to the backbone's ``from_pretrained``.
        ``kappa_head``: the new head's form, ``linear`` or the authors' ``layernorm-linear``
        (``betaprm.options.KAPPA_HEADS``).
        """
        from safetensors import SafetensorError
        from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText, AutoTokenizer

        base_model = ""
        if isinstance(model_or_path, (str, os.PathLike, ModelSource)):
            source = resolve_model(model_or_path, flag="from_backbone")
            path, base_model = str(source.path), source.name if source.is_hub else ""
            # A folder without weights, a truncated file or a partial hub snapshot: transformers
            # raises OSError or ValueError, safetensors its own error; each is the input's fault.
            try:
                vision = is_vision_config(AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code))
                auto = AutoModelForImageTextToText if vision else AutoModelForCausalLM
                backbone = auto.from_pretrained(
                    path,
                    trust_remote_code=trust_remote_code,
                    dtype=dtype,
                    use_safetensors=None,
                    **({"attn_implementation": attn_implementation} if attn_implementation else {}),
                )
                if tokenizer is None:
                    tokenizer = (
                        processor.tokenizer
                        if processor is not None
                        else AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
                    )
                if vision and processor is None:
                    processor = load_processor(path, tokenizer)
            except BetaPRMInputError:
                raise
            except (OSError, ValueError, SafetensorError) as e:
                raise unreadable_model(source, e) from None
        else:
            backbone = model_or_path
            vision = is_vision_config(backbone.config)
            if vision and processor is None:
                raise BetaPRMInputError(
                    "from_backbone got a vision-language model instance but no processor; pass processor= (its image "
                    "processor and tokenizer)"
                )
            if tokenizer is None:
                tokenizer = processor.tokenizer if processor is not None else None
            if tokenizer is None:
                raise BetaPRMInputError(
                    "from_backbone got a model instance but no tokenizer; pass tokenizer= (the "
                    "one the model was trained with)"
                )
        if processor is not None and processor.tokenizer is not tokenizer:
            raise BetaPRMInputError(
                "the processor's tokenizer must be the tokenizer given (the marker is added to it)"
            )
        config = BetaPRMConfig(
            marker=marker,
            reward_tokens=tuple(reward_tokens),
            kappa_init=kappa_init,
            kappa_min=kappa_min,
            kappa_head=kappa_head,
            template=template,
            step_separator=step_separator,
            chat_template=chat_template,
            marker_repeat=marker_repeat,
            base_model=base_model,
        )
        _ = config.trace_format  # building it validates the template and marker settings
        config.marker_id = add_marker_token(backbone, tokenizer, marker)
        yes = _single_token_id(tokenizer, config.reward_tokens[0], "reward token")
        no = _single_token_id(tokenizer, config.reward_tokens[1], "reward token")
        if config.marker_id in (yes, no):
            raise BetaPRMInputError(f"the marker {marker!r} and a reward token share token id {config.marker_id}")
        if yes == no:
            raise BetaPRMInputError(f"the reward tokens {config.reward_tokens!r} map to the same token id {yes}")
        config.reward_token_ids = (yes, no)
        if processor is not None:
            config.auto_class = "AutoModelForImageTextToText"
            config.processor_class = type(processor).__name__
            config.processor_kwargs = processor_kwargs(processor)
        return cls(backbone, tokenizer, config, processor=processor)

    @property
    def is_vision(self) -> bool:
        return self.processor is not None

    # ------------------------------------------------------------------ forward
    @property
    def device(self) -> torch.device:
        return _device_of(self.backbone)

    def _decoder(self) -> nn.Module:
        # The base model returns hidden states without applying the LM head, so no
        # full-vocabulary logits are ever computed. For *ForCausalLM classes it is
        # the ``base_model_prefix`` attribute (``model`` for Llama and Qwen2).
        model = self.backbone
        if hasattr(model, "get_base_model"):  # a peft (LoRA) wrapper: the adapted model inside
            model = model.get_base_model()
        base = getattr(model, "base_model", None)
        if base is None or base is model:
            raise BetaPRMInputError(
                f"{type(self.backbone).__name__} exposes no base model to read hidden states from; "
                "BetaPRM needs a *ForCausalLM (or vision-language *ForConditionalGeneration) backbone"
            )
        return base

    def reward_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(M, H) marker hidden states -> (M, 2) float32 ``[z_Yes, z_No]``.

        Equal to the two reward columns of the backbone's full logits at those positions,
        including the final-logit transforms some architectures apply.
        """
        head = self.backbone.get_output_embeddings()
        ids = torch.tensor(self.config.reward_token_ids, device=head.weight.device)
        if hasattr(head.weight, "ds_id"):
            # DeepSpeed ZeRO-3: the weight is whole only inside the head's own forward (and
            # its backward), so the head runs on the marker rows and the two columns are kept.
            z = head(hidden.to(head.weight.dtype)).float().index_select(-1, ids)
        else:
            weight = head.weight.index_select(0, ids).float()  # (2, H)
            z = hidden.float() @ weight.T
            if getattr(head, "bias", None) is not None:
                z = z + head.bias.index_select(0, ids).float()
        cfg = getattr(self.backbone.config, "get_text_config", lambda: self.backbone.config)()
        scale = getattr(cfg, "logit_scale", None)  # Cohere
        if scale is not None:
            z = z * scale
        cap = getattr(cfg, "final_logit_softcapping", None)  # Gemma 2/3
        if cap:
            z = torch.tanh(z / cap) * cap
        return z

    def kappa_from_hidden(self, hidden: torch.Tensor) -> torch.Tensor:
        """(M, H) -> (M,) float32 ``softplus(g(h)) + kappa_min``, ``g`` the kappa head."""
        return F.softplus(self.kappa_head(hidden).squeeze(-1)) + self.config.kappa_min

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        return_hidden: bool = False,
        detach_kappa: bool = False,
        **backbone_inputs,
    ) -> BetaPRMOutput:
        """Scores at every marker of a right- or left-padded batch ``input_ids`` (B, S).

        ``return_hidden`` also returns all last hidden states (for an auxiliary
        language-model loss during training). ``detach_kappa`` stops the kappa head's
        gradient at the hidden state (training only: the values are the same)."""
        out = self._decoder()(input_ids=input_ids, attention_mask=attention_mask, use_cache=False, **backbone_inputs)
        hidden = out.last_hidden_state  # (B, S, H)
        marker_mask = input_ids == self.config.marker_id  # (B, S)
        if self.config.marker_repeat > 1:  # read at the last marker of each run
            marker_mask[:, :-1] &= ~marker_mask[:, 1:]
        row = marker_mask.nonzero(as_tuple=True)[0]
        h = hidden[marker_mask]  # (M, H), row-major order
        z = self.reward_logits(h)
        mu = torch.softmax(z, dim=-1)[:, 0]
        return BetaPRMOutput(
            reward_logits=z,
            mu=mu,
            kappa=self.kappa_from_hidden(h.detach() if detach_kappa else h),
            row=row,
            hidden_states=hidden if return_hidden else None,
        )

    # ------------------------------------------------------------------ scoring
    def score(self, question: str, candidates, batch_size: int = 16):
        """Score every candidate of one question; returns one ``StepScores`` each.

        ``candidates``: lists of step strings, or dicts with a ``"steps"`` list.
        """
        steps = [c["steps"] if isinstance(c, dict) else c for c in candidates]
        return score_traces(self, [(question, s) for s in steps], batch_size=batch_size)

    # ------------------------------------------------------------------ save / load
    def save_pretrained(self, save_directory, state_dict: dict | None = None, *, card: dict | None = None) -> None:
        """Write a Hugging Face-style directory (safetensors only, no pickle) with its model
        card (``README.md``, ``betaprm.card``).

        ``state_dict``: this model's full state (``backbone.*`` and ``kappa_head.*``
        keys) when the live parameters are sharded, e.g. gathered from DeepSpeed ZeRO-3
        or FSDP by ``accelerator.get_state_dict``. ``card``: keyword arguments of
        ``betaprm.card.model_card`` (name, license, data, results).
        """

        from safetensors.torch import save_file

        path = Path(save_directory)
        path.mkdir(parents=True, exist_ok=True)
        if state_dict is not None:
            backbone_sd = {k[len("backbone.") :]: v for k, v in state_dict.items() if k.startswith("backbone.")}
            head_sd = {k[len("kappa_head.") :]: v for k, v in state_dict.items() if k.startswith("kappa_head.")}
            self.backbone.save_pretrained(path, state_dict=backbone_sd)
        else:
            head_sd = self.kappa_head.state_dict()
            self.backbone.save_pretrained(path)
        self.tokenizer.save_pretrained(path)
        if self.processor is not None:
            self.processor.image_processor.save_pretrained(path)
        state = {k: v.detach().cpu().float().contiguous() for k, v in head_sd.items()}
        save_file(state, path / HEAD_NAME, metadata={"format": "pt"})
        self.config.tokenizer_class = type(self.tokenizer).__name__
        self.config.tokenizer_probe_ids = _probe_ids(self.tokenizer)
        (path / CONFIG_NAME).write_text(self.config.to_json_string())
        write_model_card(path, self.config, **(card or {}))

    @classmethod
    def from_pretrained(
        cls,
        name_or_path,
        *,
        revision: str | None = None,
        trust_remote_code: bool = False,
        dtype=None,
        device=None,
        attn_implementation: str | None = None,
    ) -> BetaPRM:
        """Load a BetaPRM written by ``save_pretrained``: a local folder, or a hub name
        (``OWNER/NAME``, ``revision`` a branch, tag or commit) resolved through the Hugging
        Face cache (``betaprm.hub``). ``attn_implementation`` goes to the backbone's
        ``from_pretrained`` (default: transformers' choice)."""
        import transformers
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        source = resolve_model(name_or_path, revision, flag="from_pretrained")
        path = source.path
        cfg_file = path / CONFIG_NAME
        require_betaprm(source)
        raw = _config_json(cfg_file)
        known = set(BetaPRMConfig.__dataclass_fields__)
        unknown = sorted(set(raw) - known)
        if unknown:
            raise BetaPRMInputError(
                f"{cfg_file}: unknown keys {unknown}; the model was saved by betaprm "
                f"{raw.get('betaprm_version', '?')} and this is {version()}: upgrade betaprm (this one knows "
                f"{sorted(known)})"
            )
        config = BetaPRMConfig(**raw)
        auto = getattr(transformers, config.auto_class, None)
        if auto is None or not config.auto_class.startswith("AutoModel"):
            raise BetaPRMInputError(
                f"{cfg_file}: auto_class {config.auto_class!r} is not a transformers AutoModel class"
            )
        damaged = "the checkpoint is damaged ({}); re-save it with save_pretrained, or re-train"
        if source.is_hub:  # a partial or damaged download: the cure is a fresh one
            damaged = (
                "the hub snapshot is incomplete or damaged ({}); download it again online "
                f"(`hf download {source.name} --revision {source.revision} --force-download`)"
            )
        try:
            backbone = auto.from_pretrained(
                path,
                trust_remote_code=trust_remote_code,
                dtype=dtype,
                use_safetensors=True,
                **({"attn_implementation": attn_implementation} if attn_implementation else {}),
            )
        except (OSError, ValueError, SafetensorError) as e:  # ValueError: config.json missing
            weights = sorted(path.glob("model*.safetensors"))
            where = weights[0] if len(weights) == 1 else path / "model*.safetensors"
            raise BetaPRMInputError(
                f"{where}: cannot read the model weights or config.json: " + damaged.format(e)
            ) from None
        tok_cls = getattr(transformers, config.tokenizer_class, None) if config.tokenizer_class else None
        try:
            tokenizer = (tok_cls or transformers.AutoTokenizer).from_pretrained(
                path, trust_remote_code=trust_remote_code
            )
        except (OSError, ValueError) as e:  # ValueError (JSONDecodeError among them): tokenizer.json bad or missing
            raise BetaPRMInputError(f"{path}: cannot read the tokenizer files: " + damaged.format(e)) from None
        if config.tokenizer_probe_ids and _probe_ids(tokenizer) != config.tokenizer_probe_ids:
            raise BetaPRMInputError(
                f"{path}: the tokenizer loaded as {type(tokenizer).__name__} tokenises a probe text "
                f"differently from the {config.tokenizer_class} the model was saved with; its inputs "
                "would not be what it was trained on. Load the tokenizer the model was saved with."
            )
        marker_id = tokenizer.convert_tokens_to_ids(config.marker)
        reward_ids = tuple(_single_token_id(tokenizer, w, "reward token") for w in config.reward_tokens)
        if marker_id != config.marker_id or reward_ids != config.reward_token_ids:
            raise BetaPRMInputError(
                f"{path}: the saved tokenizer maps marker/reward tokens to {marker_id}/{reward_ids}, but "
                f"the model was trained with {config.marker_id}/{config.reward_token_ids}; the tokenizer "
                "files do not belong to this checkpoint"
            )
        head = make_kappa_head(config.kappa_head, _hidden_size(backbone))
        try:
            head.load_state_dict(load_file(path / HEAD_NAME))
        except (OSError, SafetensorError, RuntimeError) as e:  # missing, truncated, or another model's head
            raise BetaPRMInputError(
                f"{path / HEAD_NAME}: cannot read the kappa head ({config.kappa_head!r}, as {CONFIG_NAME} says): "
                + damaged.format(e)
            ) from None
        processor = None
        if config.processor_class:
            processor = load_processor(path, tokenizer, config.processor_class, config.processor_kwargs)
        model = cls(backbone, tokenizer, config, kappa_head=head, processor=processor)
        if device is not None:
            model.to(device)
        return model.eval()


def load_prm(
    name_or_path, device, trust_remote_code: bool = False, revision: str | None = None, dtype=None
) -> tuple[BetaPRM, str]:
    """A PRM for scoring, in eval mode on ``device``: ``(prm, kind)``, from a folder or a
    hub name (``betaprm.hub``). ``kind`` (``model_kind``) is ``beta``, ``standard`` or
    ``zero-shot``: a plain causal LM wrapped on the fly with its own tokenizer (the marker
    ``<prm>`` added, as ``from_backbone`` adds it), scored by its ``Yes``/``No`` logits at each
    marker; its kappa is the new head's constant ``ZERO_SHOT_KAPPA`` (4.0, ``kappa_init``),
    which says nothing: use ``mu``. A snapshot holding ``betaprm_config.json`` always loads as
    the BetaPRM it is: if it cannot, that is an error, never a zero-shot fallback. ``dtype``:
    the backbone's (``"auto"``, ``"bfloat16"``, a ``torch.dtype``; None: transformers' default);
    the kappa head stays float32."""
    source = resolve_model(name_or_path, revision)
    kind = model_kind(source)
    if kind == "zero-shot":
        prm = BetaPRM.from_backbone(
            source, trust_remote_code=trust_remote_code, dtype=dtype, kappa_init=ZERO_SHOT_KAPPA
        )
        return prm.to(device).eval(), kind
    prm = BetaPRM.from_pretrained(source.path, trust_remote_code=trust_remote_code, device=device, dtype=dtype)
    return prm.eval(), kind


ZERO_SHOT_KAPPA = 4.0
"""A plain causal LM scored zero-shot has no trained kappa head: every marker's kappa is this
constant (``from_backbone``'s ``kappa_init``), and sigma follows from it and mu alone."""


KINDS = ("beta", "standard", "zero-shot")


def model_kind(source: ModelSource | str | os.PathLike) -> str:
    """How a model folder (or a resolved ``ModelSource``) scores, read from its files
    without loading weights: ``beta`` (a BetaPRM trained with the beta-binomial objective),
    ``standard`` (a BetaPRM trained with another objective: its kappa means nothing) or
    ``zero-shot`` (a plain causal LM). The objective comes from ``betaprm_config.json``, or
    for checkpoints of older versions from their ``train_summary.json``."""
    if not isinstance(source, ModelSource):
        source = resolve_model(source)
    path = source.path
    cfg_file = path / CONFIG_NAME
    if not cfg_file.is_file():
        marks = [f for f in (HEAD_NAME, "train_summary.json", "betaprm_run.json") if (path / f).is_file()]
        if marks:
            raise BetaPRMInputError(
                f"{_where(source)} holds {marks[0]} but no {CONFIG_NAME}: a BetaPRM checkpoint that lost its config "
                "cannot be loaded (nor scored as a plain language model, which would ignore what it learned); restore "
                f"{CONFIG_NAME} from where the model was saved, or save it again"
            )
        return "zero-shot"
    objective = _config_json(cfg_file).get("objective")
    summary = path / "train_summary.json"
    if not objective and summary.is_file():
        data = load_json_file(summary, what="a training summary")
        objective = (
            data.get("config", {}).get("objective")
            if isinstance(data, dict) and isinstance(data.get("config"), dict)
            else None
        )
        if objective is None:
            raise BetaPRMInputError(
                f"{summary}: no config.objective in this training summary; restore the file written by betaprm train"
            )
    return "beta" if (objective or "beta-binomial") == "beta-binomial" else "standard"


def _config_json(cfg_file: Path) -> dict:
    """``betaprm_config.json`` as a dict, or an error saying the checkpoint is damaged."""
    try:
        raw = loads_strict(decode_utf8(cfg_file.read_bytes()))
    except (OSError, BadJSON) as e:
        raise BetaPRMInputError(
            f"{cfg_file}: the checkpoint is damaged ({e}); re-save it with save_pretrained, or re-train"
        ) from None
    if not isinstance(raw, dict):
        raise BetaPRMInputError(
            f"{cfg_file}: the checkpoint is damaged (expected a JSON object, got {type(raw).__name__}); re-save it "
            "with save_pretrained, or re-train"
        )
    return raw


def require_betaprm(source: ModelSource) -> None:
    """Stop unless ``source`` holds a BetaPRM (``betaprm_config.json``), saying what it is."""
    if not (source.path / CONFIG_NAME).is_file():
        raise BetaPRMInputError(f"{_where(source)} is not a BetaPRM: {_not_a_betaprm(source.path)}")


def _where(source: ModelSource) -> str:
    return f"{source.name} (hub snapshot {source.revision} at {source.path})" if source.is_hub else str(source.path)


def _not_a_betaprm(path: Path) -> str:
    """Why a folder without betaprm_config.json is not loaded as a BetaPRM, and what to do."""
    if (path / "config.json").is_file():
        return (
            f"no {CONFIG_NAME}, it is a plain model. Train a BetaPRM from it (betaprm train --model ...), wrap it "
            "with BetaPRM.from_backbone, or score it zero-shot with load_prm / the eval-* commands"
        )
    return f"no {CONFIG_NAME} and no config.json: not a model folder"


def _hidden_size(backbone) -> int:
    emb = backbone.get_output_embeddings()
    if emb is None or not hasattr(emb, "weight"):
        raise BetaPRMInputError(
            f"{type(backbone).__name__} has no output embedding (LM head) to read reward logits from"
        )
    return emb.weight.shape[1]


def _device_of(module: nn.Module) -> torch.device:
    return next(module.parameters()).device


def add_marker_token(backbone, tokenizer, marker: str) -> int:
    """Make ``marker`` a special token of ``tokenizer`` and give it an embedding row."""
    from tokenizers import AddedToken

    old_len = len(tokenizer)
    added = tokenizer.add_tokens([AddedToken(marker, special=True, normalized=False)], special_tokens=True)
    marker_id = tokenizer.convert_tokens_to_ids(marker)
    if added == 0:
        return marker_id
    init_token_rows(backbone, tokenizer, [marker_id], old_len)
    return marker_id


def init_token_rows(backbone, tokenizer, token_ids: Sequence[int], known: int) -> None:
    """Embedding rows for ``token_ids``, tokens just added to ``tokenizer`` (which had
    ``known`` tokens before): the embeddings grow to the tokenizer when they must."""
    emb_in = backbone.get_input_embeddings()
    old_rows = emb_in.weight.shape[0]
    if len(tokenizer) > old_rows:
        backbone.resize_token_embeddings(len(tokenizer), mean_resizing=False)
    # New rows start at the mean of the rows of real tokens: an "average token" is a
    # neutral start, where random rows can be far out of distribution.
    known = min(known, old_rows)
    with torch.no_grad():
        for emb in (backbone.get_input_embeddings(), backbone.get_output_embeddings()):
            if emb is None:
                continue
            for i in token_ids:
                emb.weight[i] = emb.weight[:known].mean(dim=0)
                if getattr(emb, "bias", None) is not None:
                    emb.bias[i] = emb.bias[:known].mean()
