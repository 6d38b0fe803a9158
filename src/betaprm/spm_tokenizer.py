"""A sentencepiece BPE ``tokenizer.model`` -> a transformers fast tokenizer, without the
sentencepiece package.

InternLM2's tokenizer (the language model of InternVL2/2.5 at 2B, 8B, 20B and 26B) is a
sentencepiece BPE model run by a remote-code class (``InternLM2Tokenizer``, InternVL's
``internvl_chat/internvl/model/internlm2/tokenization_internlm2.py``): it splits the text on
every added token (``added_tokens_decoder`` of ``tokenizer_config.json``), sentencepiece
encodes each piece between them, and BOS goes first. Some of its pieces are placeholders
(``[UNUSED_TOKEN_146]``) that ``added_tokens_decoder`` names (``<|im_start|>``).
transformers reads such a file only through sentencepiece, and how it does has changed
between versions; ``spm_bpe_tokenizer`` reads the file with protobuf and builds the same
tokenizer with the ``tokenizers`` package itself:

- the vocabulary is the model's pieces with their ids, the placeholders renamed;
- BPE with sentencepiece's merge order: a pair merges when the two pieces together are a
  normal piece, the higher-scoring piece first (leftmost first among equals), so the merges
  are the pairs that make up each normal piece, ranked by its score;
- a character that is no piece falls back to its UTF-8 bytes (``<0x..>`` pieces);
- the normaliser writes spaces as ``▁``, and nothing else: there is no pre-tokenizer;
- the added tokens are matched in the raw text first (``normalized=False``), as the slow
  class splits on them; the model's user-defined pieces are matched after the normaliser,
  as sentencepiece matches them;
- BOS (``<s> $A``) when ``add_bos_token`` (the default), no EOS unless ``add_eos_token``.

Only the case reproduced exactly is built; any other model is refused, naming what differs:
a BPE model with byte fallback whose normaliser is the identity (``add_dummy_prefix``,
``remove_extra_whitespaces`` false, no ``precompiled_charsmap``), as InternLM2's is, every
character of a normal piece itself a piece, and no unused piece that merges could make. Not
reproduced: a placeholder's own name typed in the text (``[UNUSED_TOKEN_146]`` is bytes here,
its id for sentencepiece); decoding inserts no spaces around special tokens (the ids are
what matter). Tie order between two different pieces of equal score may differ from
sentencepiece's in a hand-made vocabulary (in a trained one, a merged piece always scores
below its parts, and the order cannot change the result).
"""

from __future__ import annotations

from pathlib import Path

from .errors import BetaPRMInputError

__all__ = ["spm_bpe_tokenizer"]

# sentencepiece_model.proto's enums
_NORMAL, _UNKNOWN, _CONTROL, _USER_DEFINED, _UNUSED, _BYTE = 1, 2, 3, 4, 5, 6
_BPE = 2
_FIX = "this tokenizer cannot be rebuilt exactly without sentencepiece"


def _read_model(model_file: Path):
    try:
        from transformers.convert_slow_tokenizer import import_protobuf

        pb2 = import_protobuf()
    except ImportError:
        raise BetaPRMInputError(
            f"{model_file}: reading a sentencepiece tokenizer.model needs protobuf (`pip install protobuf`, or "
            "betaprm's `[authors]` extra)"
        ) from None
    proto = pb2.ModelProto()
    try:
        proto.ParseFromString(model_file.read_bytes())
    except OSError as e:
        raise BetaPRMInputError(f"{model_file}: cannot read it ({e})") from None
    except Exception as e:  # protobuf's DecodeError
        raise BetaPRMInputError(f"{model_file}: not a sentencepiece model ({type(e).__name__}: {e})") from None
    if not proto.pieces:
        raise BetaPRMInputError(f"{model_file}: not a sentencepiece model (no pieces)")
    return proto


def _check_spec(proto, model_file: Path) -> None:
    """Refuse every setting whose encoding this module does not reproduce exactly."""
    trainer, norm = proto.trainer_spec, proto.normalizer_spec
    problems = []
    if trainer.model_type != _BPE:
        kind = {1: "UNIGRAM", 3: "WORD", 4: "CHAR"}.get(trainer.model_type, str(trainer.model_type))
        problems.append(f"trainer_spec.model_type is {kind}, not BPE")
    if not trainer.byte_fallback:
        problems.append("trainer_spec.byte_fallback is false (unknown characters would be <unk>, not bytes)")
    if norm.add_dummy_prefix:
        problems.append("normalizer_spec.add_dummy_prefix is true (a '▁' put before each piece of text)")
    if norm.remove_extra_whitespaces:
        problems.append("normalizer_spec.remove_extra_whitespaces is true (runs of spaces collapsed)")
    if not norm.escape_whitespaces:
        problems.append("normalizer_spec.escape_whitespaces is false (spaces not written as '▁')")
    if norm.precompiled_charsmap:
        problems.append(
            f"normalizer_spec has a precompiled_charsmap ({norm.name or 'unnamed'}: a character normalisation such as "
            "NFKC)"
        )
    if problems:
        raise BetaPRMInputError(
            f"{model_file}: " + "; ".join(problems) + ". Only InternLM2's settings are converted (BPE, byte "
            "fallback, identity normaliser: no dummy prefix, no whitespace removal, no charsmap); " + _FIX
        )


def _token_entries(config: dict, config_file: Path) -> dict[int, dict]:
    raw = config.get("added_tokens_decoder") or {}
    if not isinstance(raw, dict):
        raise BetaPRMInputError(f"{config_file}: added_tokens_decoder must be an object of id -> token")
    entries = {}
    for key, value in raw.items():
        if not (isinstance(key, str) and key.isascii() and key.isdigit()) or not isinstance(value, dict):
            raise BetaPRMInputError(f"{config_file}: added_tokens_decoder entry {key!r} is not id -> token object")
        content = value.get("content")
        if not isinstance(content, str) or not content:
            raise BetaPRMInputError(f"{config_file}: added_tokens_decoder[{key}] has no content")
        entries[int(key)] = value
    return entries


def _special(config: dict, name: str, default: str) -> str:
    value = config.get(name, default)
    if isinstance(value, dict):
        value = value.get("content", default)
    return value if isinstance(value, str) and value else default


def _merges(pieces: list, vocab: dict[str, int], renamed: set[int], model_file: Path) -> list[tuple[str, str]]:
    """Every pair of pieces that make up a normal piece, ranked by that piece's score (higher
    first), then by ids; refuses pieces sentencepiece could reach and this BPE could not."""
    ranked, missing, unused = [], [], []
    for i, p in enumerate(pieces):
        if i in renamed or p.type not in (_NORMAL, _UNUSED) or len(p.piece) < 2:
            continue
        text = p.piece
        pairs = [(text[:k], text[k:]) for k in range(1, len(text)) if text[:k] in vocab and text[k:] in vocab]
        if p.type == _UNUSED:
            if pairs:
                unused.append(f"{text!r} (id {i})")
            continue
        if any(c not in vocab for c in text):
            missing.append(f"{text!r} (id {i})")
        ranked += [(-p.score, i, vocab[a], vocab[b], a, b) for a, b in pairs]
    if missing or unused:
        what = []
        if missing:
            what.append(f"normal pieces with a character that is no piece: {', '.join(missing[:5])}")
        if unused:
            what.append(f"unused pieces that merges make (sentencepiece splits them again): {', '.join(unused[:5])}")
        raise BetaPRMInputError(f"{model_file}: {'; '.join(what)}; not a trained BPE model like InternLM2's; {_FIX}")
    ranked.sort()
    return [(a, b) for *_, a, b in ranked]


def spm_bpe_tokenizer(model_file, tokenizer_config: dict, config_file, **kwargs):
    """The fast tokenizer (transformers' ``TokenizersBackend``) that gives the token ids of
    an ``InternLM2Tokenizer``-like slow tokenizer: sentencepiece model ``model_file`` with the
    added tokens of ``tokenizer_config`` (read from ``config_file``, named in messages).
    ``kwargs`` go to ``TokenizersBackend`` (e.g. ``extra_special_tokens``). It saves as a
    ``tokenizer.json`` that plain ``AutoTokenizer`` reloads."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, processors
    from transformers import TokenizersBackend

    model_file, config_file = Path(model_file), Path(config_file)
    proto = _read_model(model_file)
    _check_spec(proto, model_file)
    pieces = list(proto.pieces)
    entries = _token_entries(tokenizer_config, config_file)
    names = [entries[i]["content"] if i in entries else p.piece for i, p in enumerate(pieces)]
    renamed = {i for i, p in enumerate(pieces) if names[i] != p.piece}
    vocab: dict[str, int] = {}
    for i, name in enumerate(names):
        if vocab.setdefault(name, i) != i:
            raise BetaPRMInputError(
                f"{model_file}: the piece {name!r} is both id {vocab[name]} and id {i}"
                + (f" (renamed by {config_file.name}'s added_tokens_decoder)" if i in renamed else "")
            )
    byte_pieces = {f"<0x{b:02X}>" for b in range(256)}
    have = {p.piece for p in pieces if p.type == _BYTE}
    if byte_pieces - have:
        raise BetaPRMInputError(
            f"{model_file}: byte fallback without all 256 byte pieces (missing "
            f"{', '.join(sorted(byte_pieces - have)[:5])}); {_FIX}"
        )
    unk = [names[i] for i, p in enumerate(pieces) if p.type == _UNKNOWN]
    if len(unk) != 1:
        raise BetaPRMInputError(f"{model_file}: {len(unk)} unknown pieces; a sentencepiece model has one")
    merges = _merges(pieces, vocab, renamed, model_file)

    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token=unk[0], fuse_unk=True, byte_fallback=True))
    tok.normalizer = normalizers.Replace(" ", "▁")
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    # sentencepiece's user-defined pieces: matched on the normalised text, kept whole.
    tok.add_tokens(
        [
            AddedToken(names[i], special=False, normalized=True)
            for i, p in enumerate(pieces)
            if p.type == _USER_DEFINED and i not in renamed and i not in entries
        ]
    )
    # The slow class's added tokens, in id order: the pieces they rename keep their ids, the rest follow.
    for i in sorted(entries):
        e = entries[i]
        token = AddedToken(
            e["content"],
            special=bool(e.get("special", True)),
            normalized=False,
            lstrip=bool(e.get("lstrip", False)),
            rstrip=bool(e.get("rstrip", False)),
            single_word=bool(e.get("single_word", False)),
        )
        (tok.add_special_tokens if token.special else tok.add_tokens)([token])

    add_bos = tokenizer_config.get("add_bos_token", True) is not False
    add_eos = tokenizer_config.get("add_eos_token", False) is True
    bos, eos = _special(tokenizer_config, "bos_token", "<s>"), _special(tokenizer_config, "eos_token", "</s>")
    single = " ".join([f"{bos}:0"] * add_bos + ["$A:0"] + [f"{eos}:0"] * add_eos)
    pair = single + " " + " ".join([f"{bos}:1"] * add_bos + ["$B:1"] + [f"{eos}:1"] * add_eos)
    specials = {t: tok.token_to_id(t) for t, used in ((bos, add_bos), (eos, add_eos)) if used}
    if None in specials.values():
        raise BetaPRMInputError(f"{config_file}: bos_token {bos!r} or eos_token {eos!r} is not in {model_file.name}")
    tok.post_processor = processors.TemplateProcessing(single=single, pair=pair, special_tokens=list(specials.items()))

    fast = TokenizersBackend(
        tokenizer_object=tok,
        bos_token=bos,
        eos_token=eos,
        unk_token=_special(tokenizer_config, "unk_token", unk[0]),
        pad_token=_special(tokenizer_config, "pad_token", eos),
        add_bos_token=add_bos,
        add_eos_token=add_eos,
        clean_up_tokenization_spaces=False,
        **kwargs,
    )
    got = {i: fast.convert_tokens_to_ids(e["content"]) for i, e in entries.items()}
    wrong = [f"{entries[i]['content']!r} is {j}, not {i}" for i, j in got.items() if j != i]
    size, built = max(len(pieces), max(entries, default=-1) + 1), tok.get_vocab_size(with_added_tokens=True)
    if wrong or built != size:
        raise BetaPRMInputError(
            f"{config_file}: the added tokens do not land on their ids ({'; '.join(wrong[:5]) or 'ids with gaps'}; "
            f"{built} tokens, not {size}); fix: use the tokenizer_config.json saved with {model_file.name}"
        )
    return fast
