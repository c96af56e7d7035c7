"""Tokenizer: the `tokenizers` library, loaded from tokenizer.json or built from GGUF metadata,
plus special-token rules and Jinja2 chat templates that behave like transformers'."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers, processors
from tokenizers import Tokenizer as _HFTokenizer

# Pre-tokenizer regexes by GGUF `tokenizer.ggml.pre` (the same splits the HF tokenizer.json uses).
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_DIGIT_SPLIT_PRE = {"smollm", "starcoder", "refact", "codeshell", "falcon"}
_GGUF_CONTROL, _GGUF_USER_DEFINED, _GGUF_BYTE = 3, 4, 6
# Control tokens that close a chat turn (llama.cpp's end-of-generation names)
_END_OF_TURN = ("<end_of_turn>", "<|eot_id|>", "<|im_end|>", "<|end|>", "<|end_of_text|>",
                "<|endoftext|>", "<EOT>")


class Tokenizer:
    """Text <-> token ids, special tokens and chat templates.

    `encode(text)` applies the model's BOS/EOS rules; `decode(ids)` accepts lists or NumPy arrays,
    so `transformers.TextStreamer(pipeline.tokenizer)` works on it.
    """

    def __init__(
        self,
        tokenizer: _HFTokenizer,
        bos_token: str | None = None,
        eos_token: str | None = None,
        pad_token: str | None = None,
        unk_token: str | None = None,
        chat_template: str | None = None,
        extra_eos_tokens: Sequence[str] = (),
    ):
        self._tok = tokenizer
        self.bos_token, self.eos_token = bos_token, eos_token
        self.pad_token, self.unk_token = pad_token or eos_token, unk_token
        self.chat_template = chat_template
        self.extra_eos_tokens = list(extra_eos_tokens)
        self._token_bytes: dict[bool, list[bytes] | None] = {}

    # ---- construction -------------------------------------------------------------------------
    @classmethod
    def from_files(cls, folder: Path) -> Tokenizer:
        """From an HF folder: tokenizer.json (+ tokenizer_config.json, special_tokens_map.json)."""
        path = folder / "tokenizer.json"
        if not path.is_file():
            raise FileNotFoundError(
                f"no tokenizer.json in {folder}; sparsellm needs the fast-tokenizer file "
                "(save it with transformers' `tokenizer.save_pretrained(folder)`)"
            )
        tok = _HFTokenizer.from_file(str(path))
        config = _read_json(folder / "tokenizer_config.json")
        special = _read_json(folder / "special_tokens_map.json")
        template = config.get("chat_template")
        template_file = folder / "chat_template.jinja"
        if template is None and template_file.is_file():
            template = template_file.read_text()
        if isinstance(template, list):  # [{"name": "default", "template": ...}, ...]
            named = {t["name"]: t["template"] for t in template}
            template = named.get("default", next(iter(named.values()), None))

        def special_token(key: str) -> str | None:
            value = config.get(key, special.get(key))
            return value.get("content") if isinstance(value, dict) else value

        self = cls(
            tok,
            bos_token=special_token("bos_token"),
            eos_token=special_token("eos_token"),
            pad_token=special_token("pad_token"),
            unk_token=special_token("unk_token"),
            chat_template=template,
        )
        # Tokenizers whose tokenizer.json has no post-processor for BOS (add_bos_token flag in
        # tokenizer_config.json, as in Llama 2 / Mistral conversions) get one here.
        self._ensure_special_rules(
            add_bos=config.get("add_bos_token"), add_eos=config.get("add_eos_token")
        )
        return self

    @classmethod
    def from_gguf_metadata(cls, meta: dict[str, Any]) -> Tokenizer:
        """Build from GGUF `tokenizer.ggml.*` metadata: byte-level BPE (`gpt2`) or
        SentencePiece-style BPE with byte fallback (`llama`)."""
        kind = meta.get("tokenizer.ggml.model")
        tokens: list[str] = list(meta["tokenizer.ggml.tokens"])
        types = list(meta.get("tokenizer.ggml.token_type", [1] * len(tokens)))
        vocab = {t: i for i, t in enumerate(tokens)}
        unk_id = meta.get("tokenizer.ggml.unknown_token_id")
        if kind == "gpt2":
            merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
            tok = _HFTokenizer(models.BPE(vocab, merges, ignore_merges=False))
            tok.pre_tokenizer = _gguf_pre_tokenizer(meta.get("tokenizer.ggml.pre", "default"))
            tok.decoder = decoders.ByteLevel()
        elif kind == "llama":
            scores = list(meta.get("tokenizer.ggml.scores", [0.0] * len(tokens)))
            # An id past the vocabulary names no token (llama.cpp ignores it too)
            unk = tokens[unk_id] if unk_id is not None and 0 <= unk_id < len(tokens) else None
            tok = _HFTokenizer(
                models.BPE(vocab, _merges_from_scores(tokens, scores, types), unk_token=unk,
                           byte_fallback=True, fuse_unk=True)
            )
            norms = [normalizers.Replace(" ", "▁")]
            if meta.get("tokenizer.ggml.add_space_prefix", True):
                norms.insert(0, normalizers.Prepend("▁"))
            tok.normalizer = normalizers.Sequence(norms)
            steps = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
            if meta.get("tokenizer.ggml.add_space_prefix", True):
                steps.append(decoders.Strip(" ", 1, 0))
            tok.decoder = decoders.Sequence(steps)
        else:
            raise ValueError(
                f"unsupported GGUF tokenizer model {kind!r}; supported: gpt2 (byte-level BPE), "
                "llama (SentencePiece BPE)"
            )
        tok.add_tokens([
            AddedToken(t, special=False, normalized=False)
            for t, ty in zip(tokens, types, strict=True) if ty == _GGUF_USER_DEFINED
        ])
        tok.add_special_tokens([
            AddedToken(t, special=True, normalized=False)
            for t, ty in zip(tokens, types, strict=True) if ty == _GGUF_CONTROL
        ])

        def token(key: str) -> str | None:
            i = meta.get(f"tokenizer.ggml.{key}_token_id")
            return tokens[i] if i is not None and 0 <= i < len(tokens) else None

        self = cls(
            tok,
            bos_token=token("bos"),
            eos_token=token("eos"),
            pad_token=token("padding"),
            unk_token=token("unknown"),
            chat_template=meta.get("tokenizer.chat_template"),
            # End-of-turn tokens end generation too, as in llama.cpp (its EOG set): the
            # file's eot id, and the control tokens chat formats close a turn with
            extra_eos_tokens=[t for t in [token("eot")] if t] + [
                t for t, ty in zip(tokens, types, strict=True)
                if ty == _GGUF_CONTROL and t in _END_OF_TURN],
        )
        self._ensure_special_rules(
            add_bos=meta.get("tokenizer.ggml.add_bos_token", kind == "llama"),
            add_eos=meta.get("tokenizer.ggml.add_eos_token", False),
        )
        return self

    def _ensure_special_rules(self, add_bos: bool | None, add_eos: bool | None) -> None:
        if not (add_bos or add_eos):
            return
        probe = self._tok.encode("a", add_special_tokens=True).ids
        has_bos = self.bos_token_id is not None and probe[:1] == [self.bos_token_id]
        has_eos = self.eos_token_id is not None and probe[-1:] == [self.eos_token_id]
        if (not add_bos or has_bos) and (not add_eos or has_eos):
            return
        bos = [(self.bos_token, self.bos_token_id)] if add_bos and self.bos_token else []
        eos = [(self.eos_token, self.eos_token_id)] if add_eos and self.eos_token else []
        single = " ".join([*(b for b, _ in bos), "$A", *(e for e, _ in eos)])
        pair = " ".join([*(b for b, _ in bos), "$A", *(e for e, _ in eos),
                         *(b for b, _ in bos), "$B", *(e for e, _ in eos)])
        self._tok.post_processor = processors.TemplateProcessing(
            single=single, pair=pair, special_tokens=bos + eos
        )

    # ---- ids ------------------------------------------------------------------------------------
    def token_to_id(self, token: str | None) -> int | None:
        return None if token is None else self._tok.token_to_id(token)

    @property
    def bos_token_id(self) -> int | None:
        return self.token_to_id(self.bos_token)

    @property
    def eos_token_id(self) -> int | None:
        return self.token_to_id(self.eos_token)

    @property
    def pad_token_id(self) -> int | None:
        return self.token_to_id(self.pad_token)

    @property
    def eos_token_ids(self) -> list[int]:
        ids = [self.token_to_id(t) for t in [self.eos_token, *self.extra_eos_tokens]]
        return [i for i in dict.fromkeys(ids) if i is not None]

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def get_vocab(self) -> dict[str, int]:
        return self._tok.get_vocab(with_added_tokens=True)

    def __len__(self) -> int:
        return self.vocab_size

    # ---- text -----------------------------------------------------------------------------------
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def __call__(self, text: str | list[str], add_special_tokens: bool = True) -> dict[str, Any]:
        if isinstance(text, str):
            return {"input_ids": self.encode(text, add_special_tokens)}
        return {"input_ids": [self.encode(t, add_special_tokens) for t in text]}

    def decode(self, ids: Sequence[int] | np.ndarray, skip_special_tokens: bool = False,
               **_: Any) -> str:
        if type(ids) is not list or (ids and type(ids[0]) is not int):  # a list of ints as is
            ids = np.asarray(ids).reshape(-1).tolist()
        return self._tok.decode(ids, skip_special_tokens=skip_special_tokens)

    def token_bytes(self, skip_special_tokens: bool = False) -> list[bytes] | None:
        """The bytes each token id stands for, when decoding ids is joining their bytes and
        reading them as UTF-8 (byte-level BPE: GPT-2, Llama 3, Qwen2, SmolLM2), else None.

        A streaming detokenizer then looks each new token up instead of decoding a window of
        them. Built on first use and checked once against the library's decode of the whole
        vocabulary, so a tokenizer this rule does not describe exactly gets None.
        """
        if skip_special_tokens not in self._token_bytes:
            self._token_bytes[skip_special_tokens] = self._build_token_bytes(skip_special_tokens)
        return self._token_bytes[skip_special_tokens]

    def _build_token_bytes(self, skip_special: bool) -> list[bytes] | None:
        if not isinstance(self._tok.decoder, decoders.ByteLevel):
            return None
        special = {i for i, t in self._tok.get_added_tokens_decoder().items() if t.special}
        table = []
        for i in range(self.vocab_size):
            piece = self._tok.id_to_token(i)
            if piece is None or (skip_special and i in special):
                table.append(b"")
                continue
            try:
                table.append(piece.translate(_BYTE_LEVEL_TO_LATIN1).encode("latin-1"))
            except UnicodeEncodeError:  # not all byte-level characters (an added token's text):
                table.append(piece.encode())  # the text as is, as the library does
        every = self._tok.decode(list(range(self.vocab_size)), skip_special_tokens=skip_special)
        return table if b"".join(table).decode("utf-8", "replace") == every else None

    def convert_ids_to_tokens(self, ids: Sequence[int]) -> list[str | None]:
        return [self._tok.id_to_token(int(i)) for i in ids]

    # ---- chat -----------------------------------------------------------------------------------
    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        tokenize: bool = True,
        add_generation_prompt: bool = False,
        chat_template: str | None = None,
        **kwargs: Any,
    ) -> str | list[int]:
        """Render `messages` with the model's Jinja2 chat template, like transformers.

        Returns token ids when `tokenize` (special tokens come from the template, so none are
        added), else the rendered string.
        """
        template = chat_template or self.chat_template
        if template is None:
            raise ValueError(
                "this model has no chat template (tokenizer_config.json `chat_template` or GGUF "
                "`tokenizer.chat_template`); pass chat_template=... or use a plain prompt"
            )
        text = _compile_template(template).render(
            messages=messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=self.bos_token or "",
            eos_token=self.eos_token or "",
            pad_token=self.pad_token or "",
            unk_token=self.unk_token or "",
            **kwargs,
        )
        return self.encode(text, add_special_tokens=False) if tokenize else text


def _byte_level_translation() -> dict[int, str]:
    """str.translate table from GPT-2's byte-level alphabet (the printable Latin-1 bytes stand
    for themselves, the others for chr(256 + n) in byte order) to chr(byte), so that
    .encode("latin-1") gives the bytes; any other character becomes U+10FFFF, which fails it."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    rest = [b for b in range(256) if b not in printable]
    return {b: chr(b) for b in printable} | {b: "\U0010ffff" for b in rest} | \
        {256 + n: chr(b) for n, b in enumerate(rest)}


_BYTE_LEVEL_TO_LATIN1 = _byte_level_translation()


def _gguf_pre_tokenizer(pre: str) -> pre_tokenizers.PreTokenizer:
    if pre in _DIGIT_SPLIT_PRE:
        return pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ])
    if pre in {"llama-bpe", "llama3", "smaug-bpe", "dbrx"}:
        split = _LLAMA3_SPLIT
    elif pre in {"qwen2", "deepseek-r1-qwen"}:
        split = _QWEN2_SPLIT
    else:  # "default", "gpt-2" and anything else llama.cpp treats with the GPT-2 regex
        return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    return pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(split), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])


def _merges_from_scores(
    tokens: list[str], scores: list[float], types: list[int]
) -> list[tuple[str, str]]:
    """SentencePiece BPE stores no merges: derive them, ranking each merge by the score of the
    piece it produces (higher score = earlier merge), as SentencePiece itself does."""
    vocab = {t: i for i, t in enumerate(tokens) if types[i] not in (_GGUF_CONTROL, _GGUF_BYTE)}
    found = []
    for piece, pid in vocab.items():
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in vocab and right in vocab:
                found.append((-scores[pid], vocab[left], vocab[right], left, right))
    found.sort()
    return [(left, right) for *_, left, right in found]


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.is_file() else {}


_TEMPLATE_CACHE: dict[str, Any] = {}


def _compile_template(source: str) -> Any:
    """Compile with the same sandboxed Jinja2 environment and helpers transformers uses."""
    if source not in _TEMPLATE_CACHE:
        from jinja2.exceptions import TemplateError
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message: str) -> None:
            raise TemplateError(message)

        def tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None,
                   separators: Any = None, sort_keys: bool = False) -> str:
            return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent,
                              separators=separators, sort_keys=sort_keys)

        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
        )
        env.filters["tojson"] = tojson
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        _TEMPLATE_CACHE[source] = env.from_string(source)
    return _TEMPLATE_CACHE[source]
