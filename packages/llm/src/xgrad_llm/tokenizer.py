"""Tokenizers built from GGUF metadata: text in, token ids out (and back).

`Tokenizer.from_gguf(metadata)` reads the `tokenizer.ggml.*` keys of a GGUF file and builds one of two models behind
one interface, following the rules of llama.cpp's tokenizer (the reference the ids are checked against):

- `tokenizer.ggml.model = "llama"`: SentencePiece-style BPE over a scored vocabulary (gemma, llama 2, mistral v1).
  Spaces become `▁`; the text is split into characters, then the adjacent pair whose concatenation is the
  highest-scoring token is merged, again and again (ties: the leftmost pair); a character left that is not a token
  is written as its UTF-8 bytes with the `<0xNN>` byte tokens. `tokenizer.ggml.add_space_prefix` puts a space
  before the text (and after every special token).
- `tokenizer.ggml.model = "gpt2"`: byte-level BPE (llama 3, qwen2/3, mistral tekken). The text is cut into words by
  the pre-tokenizer regexes named by `tokenizer.ggml.pre` (`PRE_TOKENIZERS`), each word's bytes are spelled with
  GPT-2's byte-to-unicode alphabet, and `tokenizer.ggml.merges` are applied lowest rank first.

Before either model runs, special tokens are cut out of the text as whole tokens: control (and unknown) tokens when
`parse_special=True`, user-defined tokens always, longest token text first. BOS is prepended when
`tokenizer.ggml.add_bos_token` says so (or `encode(add_bos=...)`), EOS appended per `tokenizer.ggml.add_eos_token`.
End of generation (`is_eog`) is EOS, the end-of-turn/end-of-message ids of the metadata, and the control tokens
models use to end a turn (`<end_of_turn>`, `<|eot_id|>`, `<|im_end|>`, ...).

`decode(ids)` joins the bytes of each token (control tokens write nothing unless `special=True`) and decodes UTF-8;
`StreamDecoder` does the same one token at a time, holding back the bytes of a character that is not complete yet.
"""

from __future__ import annotations

import codecs
import heapq
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, Protocol

import regex  # type: ignore[import-untyped, unused-ignore]  # no stubs shipped; used for \p{L}-style classes

from xgrad.errors import XgradError


class TokenizerError(XgradError, ValueError):
    """The tokenizer metadata of a model is missing, malformed or of a kind this package does not support, or a
    token id is out of range."""


class TokenType(IntEnum):
    """`tokenizer.ggml.token_type` values (llama.cpp's token types)."""

    NORMAL = 1
    UNKNOWN = 2
    CONTROL = 3
    USER_DEFINED = 4
    UNUSED = 5
    BYTE = 6


# `tokenizer.ggml.pre` -> the regexes that cut text into words, applied in order: each one splits every piece the
# previous ones left into its matches and the text between them (llama.cpp's presets; these are the patterns of the
# models' tokenizer.json, where llama.cpp adapted them only to its own regex engine).
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3 = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2 = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_TEKKEN = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
PRE_TOKENIZERS: dict[str, tuple[str, ...]] = {
    "default": (r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"),
    "gpt-2": (_GPT2,),
    "llama3": (_LLAMA3,),
    "qwen2": (_QWEN2,),
    "tekken": (_TEKKEN,),
    "smollm": (r"\p{N}", _GPT2),
}
_PRE_ALIASES = {
    "llama-bpe": "llama3",
    "llama-v3": "llama3",
    "falcon3": "llama3",
    "dbrx": "llama3",
    "smaug-bpe": "llama3",
    "deepseek-r1-qwen": "qwen2",
    "stablelm2": "qwen2",
    "gpt2": "gpt-2",
    "phi-2": "gpt-2",
    "mpt": "gpt-2",
    "olmo": "gpt-2",
    "jais": "gpt-2",
    "starcoder": "smollm",
    "refact": "smollm",
    "command-r": "smollm",
    "codeshell": "smollm",
    "exaone": "smollm",
}
# presets whose words that are already whole tokens skip the merges (as their tokenizer.json says: ignore_merges)
_IGNORE_MERGES = frozenset({"llama3", "tekken"})
_SPECIAL_BOS_PRESETS = frozenset({"llama3", "tekken"})  # BPE presets whose models want BOS when the file is silent

# control tokens that end a turn in the chat formats models use; each is end-of-generation where the vocab has it
_EOT_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<EOT>", "_<EOT>")
_EOG_TEXTS = _EOT_TEXTS + ("<|eom_id|>", "<|end_of_text|>", "<end_of_utterance>", "<|return|>", "<|call|>")

_SPACE = "\u2581"  # SentencePiece's visible space, ▁
_UNKNOWN_PIECE = "\u2585".encode()  # what llama.cpp prints for an unknown token, ▅


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte alphabet: each byte becomes one printable character (printable ASCII and Latin-1
    bytes stand for themselves; the others are numbered from U+0100 in byte order)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    out = {b: chr(b) for b in keep}
    extra = 0
    for b in range(256):
        if b not in out:
            out[b] = chr(256 + extra)
            extra += 1
    return out


_BYTE_TO_CHAR = bytes_to_unicode()
_CHAR_TO_BYTE = {c: b for b, c in _BYTE_TO_CHAR.items()}


@dataclass(frozen=True)
class _Vocab:
    tokens: list[str]
    types: list[int]
    scores: list[float]
    ids: dict[str, int]  # token text -> id (the last id holding a text wins, as in llama.cpp)

    def get(self, text: str) -> int | None:
        return self.ids.get(text)


class _Model(Protocol):
    """What each tokenizer model provides: encode one run of plain text, and the bytes one token stands for."""

    name: str

    def encode_text(self, text: str, after_special: bool) -> list[int]: ...

    def token_bytes(self, token_id: int) -> bytes: ...


def _merge(symbols: list[str], pair_priority: Any) -> list[str]:
    """Merge adjacent symbols, best pair first, until no pair merges. `pair_priority(left, right)` is a sort key
    (lower merges first) or None when the pair does not merge; equal keys merge the leftmost pair first."""
    n = len(symbols)
    texts = list(symbols)
    prev = list(range(-1, n - 1))
    nxt = [*range(1, n), -1]
    heap: list[tuple[Any, int, int, str]] = []

    def push(left: int, right: int) -> None:
        if left < 0 or right < 0:
            return
        key = pair_priority(texts[left], texts[right])
        if key is not None:
            heapq.heappush(heap, (key, left, right, texts[left] + texts[right]))

    for i in range(n - 1):
        push(i, i + 1)
    while heap:
        _, left, right, merged = heapq.heappop(heap)
        if not texts[left] or not texts[right] or texts[left] + texts[right] != merged:
            continue  # one side changed since this pair was queued
        texts[left] = merged
        texts[right] = ""
        nxt[left] = nxt[right]
        if nxt[right] >= 0:
            prev[nxt[right]] = left
        push(prev[left], left)
        push(left, nxt[left])
    return [t for t in texts if t]


class _SentencePiece:
    """SentencePiece-style BPE on token scores, with byte fallback (llama.cpp's SPM tokenizer)."""

    name = "llama"

    def __init__(self, vocab: _Vocab, add_space_prefix: bool, unk_id: int | None) -> None:
        self.vocab = vocab
        self.add_space_prefix = add_space_prefix
        self.unk_id = unk_id
        self._byte_ids = [self._byte_id(b) for b in range(256)]

    def _byte_id(self, b: int) -> int | None:
        found = self.vocab.get(f"<0x{b:02X}>")
        return found if found is not None else self.vocab.get(chr(b)) if b < 0x80 else None

    def _priority(self, left: str, right: str) -> tuple[float] | None:
        token = self.vocab.get(left + right)
        return None if token is None else (-self.vocab.scores[token],)

    def encode_text(self, text: str, after_special: bool) -> list[int]:
        if self.add_space_prefix and after_special:
            text = " " + text
        out: list[int] = []
        for piece in _merge(list(text.replace(" ", _SPACE)), self._priority):
            token = self.vocab.get(piece)
            if token is not None:
                out.append(token)
                continue
            for b in piece.encode("utf-8", "surrogatepass"):
                byte_token = self._byte_ids[b]
                if byte_token is None:
                    byte_token = self.unk_id
                if byte_token is None:
                    raise TokenizerError(
                        f"the character {piece!r} is not in the vocabulary and the vocabulary has neither the byte "
                        f"token <0x{b:02X}> nor an unknown token (tokenizer.ggml.unknown_token_id); the model file's "
                        "tokenizer is incomplete: re-convert it"
                    )
                out.append(byte_token)
        return out

    def token_bytes(self, token_id: int) -> bytes:
        text = self.vocab.tokens[token_id]
        kind = self.vocab.types[token_id]
        if kind == TokenType.BYTE:
            return bytes([int(text[3:-1], 16)])
        if kind == TokenType.UNKNOWN:
            return _UNKNOWN_PIECE
        if kind in (TokenType.NORMAL, TokenType.USER_DEFINED):
            return text.replace(_SPACE, " ").encode("utf-8", "surrogateescape")
        return b""  # control and unused tokens print nothing


class _BytePairBPE:
    """Byte-level BPE with merge ranks and a regex pre-tokenizer (llama.cpp's BPE tokenizer)."""

    name = "gpt2"

    def __init__(self, vocab: _Vocab, merges: Sequence[str], pre: str) -> None:
        self.vocab = vocab
        self.pre = pre
        self.patterns = [regex.compile(p) for p in PRE_TOKENIZERS[pre]]
        self.ignore_merges = pre in _IGNORE_MERGES
        self.ranks: dict[tuple[str, str], int] = {}
        for rank, merge in enumerate(merges):
            cut = merge.find(" ", 1)
            if cut < 0:
                raise TokenizerError(
                    f"tokenizer.ggml.merges[{rank}] = {merge!r} is not two tokens separated by a space; the model "
                    "file's tokenizer is malformed: re-convert it"
                )
            self.ranks.setdefault((merge[:cut], merge[cut + 1 :]), rank)
        self._cache: dict[str, list[int]] = {}

    def _priority(self, left: str, right: str) -> tuple[int] | None:
        rank = self.ranks.get((left, right))
        return None if rank is None else (rank,)

    def split_words(self, text: str) -> list[str]:
        """The pre-tokenizer: the words BPE runs on, in order, covering the whole text."""
        pieces = [text]
        for pattern in self.patterns:
            cut: list[str] = []
            for piece in pieces:
                start = 0
                for m in pattern.finditer(piece):
                    if m.start() > start:
                        cut.append(piece[start : m.start()])
                    if m.end() > m.start():
                        cut.append(m.group())
                    start = m.end()
                if start < len(piece):
                    cut.append(piece[start:])
            pieces = cut
        return pieces

    def _encode_word(self, word: str) -> list[int]:
        spelled = "".join(_BYTE_TO_CHAR[b] for b in word.encode("utf-8", "surrogatepass"))
        whole = self.vocab.get(spelled)
        if self.ignore_merges and whole is not None:
            return [whole]
        out: list[int] = []
        for piece in _merge(list(spelled), self._priority):
            token = self.vocab.get(piece)
            if token is not None:
                out.append(token)
                continue
            out.extend(t for c in piece if (t := self.vocab.get(c)) is not None)  # llama.cpp drops what has no token
        return out

    def encode_text(self, text: str, after_special: bool) -> list[int]:
        out: list[int] = []
        for word in self.split_words(text):
            ids = self._cache.get(word)
            if ids is None:
                ids = self._encode_word(word)
                if len(self._cache) < 65536:
                    self._cache[word] = ids
            out.extend(ids)
        return out

    def token_bytes(self, token_id: int) -> bytes:
        text = self.vocab.tokens[token_id]
        kind = self.vocab.types[token_id]
        if kind == TokenType.NORMAL:
            return b"".join(
                bytes([_CHAR_TO_BYTE[c]]) if c in _CHAR_TO_BYTE else c.encode("utf-8", "surrogateescape") for c in text
            )
        if kind == TokenType.BYTE:
            return bytes([int(text[3:-1], 16)])
        if kind in (TokenType.USER_DEFINED, TokenType.UNKNOWN):
            return text.encode("utf-8", "surrogateescape")
        return b""  # control and unused tokens print nothing


def _meta_list(metadata: dict[str, Any], key: str, n: int | None, default: Any = None) -> list[Any]:
    value = metadata.get(key)
    if value is None:
        if default is None:
            raise TokenizerError(f"the model's metadata has no {key}: this GGUF file holds no tokenizer")
        return [default] * (n or 0)
    if not isinstance(value, list):
        raise TokenizerError(f"{key} must be an array, the model's metadata holds a {type(value).__name__}")
    if n is not None and len(value) != n:
        raise TokenizerError(
            f"{key} has {len(value)} entries but tokenizer.ggml.tokens has {n}; the file's tokenizer is malformed"
        )
    return value


def _meta_id(metadata: dict[str, Any], key: str, n: int, default: int | None) -> int | None:
    value = metadata.get(key, default)
    if value is None or value == -1 or value == 0xFFFFFFFF:
        return None
    if not isinstance(value, int) or not 0 <= value < n:
        raise TokenizerError(f"{key} = {value!r} is not a token id of this {n}-token vocabulary")
    return value


class Tokenizer:
    """Text to token ids and back, for the vocabulary of one GGUF model. Build it with `Tokenizer.from_gguf`.

    >>> tok = Tokenizer.from_gguf({
    ...     "tokenizer.ggml.model": "llama",
    ...     "tokenizer.ggml.tokens": ["<unk>", "<s>", "</s>", "▁", "h", "i", "▁h", "▁hi"],
    ...     "tokenizer.ggml.scores": [0.0, 0.0, 0.0, -1.0, -2.0, -3.0, -1.5, -0.5],
    ...     "tokenizer.ggml.token_type": [2, 3, 3, 1, 1, 1, 1, 1],
    ... })
    >>> tok.encode("hi hi")
    [1, 7, 7]
    >>> tok.decode([1, 7, 7])
    'hi hi'
    """

    def __init__(
        self,
        vocab: _Vocab,
        model: _Model,
        bos_id: int | None,
        eos_id: int | None,
        eot_id: int | None,
        eog_ids: frozenset[int],
        add_bos: bool,
        add_eos: bool,
        add_space_prefix: bool,
    ) -> None:
        self._vocab = vocab
        self._model = model
        self.bos_id = bos_id
        self.eos_id = eos_id
        self.eot_id = eot_id
        self.eog_ids = eog_ids
        self.add_bos = add_bos
        self.add_eos = add_eos
        self.add_space_prefix = add_space_prefix
        self.model = model.name
        # special tokens matched in text as whole tokens, longest text first
        special = [
            (text, i)
            for i, (text, kind) in enumerate(zip(vocab.tokens, vocab.types, strict=True))
            if text and kind in (TokenType.CONTROL, TokenType.USER_DEFINED, TokenType.UNKNOWN)
        ]
        special.sort(key=lambda item: (-len(item[0]), item[1]))
        self._special_all = special
        self._special_user = [(t, i) for t, i in special if vocab.types[i] == TokenType.USER_DEFINED]

    @classmethod
    def from_gguf(cls, metadata: dict[str, Any]) -> Tokenizer:
        """The tokenizer described by the `tokenizer.ggml.*` keys of a GGUF file's metadata
        (`open_gguf(path).metadata`)."""
        kind = metadata.get("tokenizer.ggml.model")
        if kind not in ("llama", "gpt2"):
            raise TokenizerError(
                f"tokenizer.ggml.model = {kind!r} is not supported: xgrad_llm reads 'llama' (SentencePiece-style) "
                "and 'gpt2' (byte-level BPE) vocabularies; use a model whose GGUF file has one of them"
            )
        tokens = _meta_list(metadata, "tokenizer.ggml.tokens", None)
        n = len(tokens)
        if n == 0 or not all(isinstance(t, str) for t in tokens):
            raise TokenizerError("tokenizer.ggml.tokens must be a non-empty array of strings")
        types = [int(t) for t in _meta_list(metadata, "tokenizer.ggml.token_type", n, int(TokenType.NORMAL))]
        scores = [float(s) for s in _meta_list(metadata, "tokenizer.ggml.scores", n, 0.0)]
        vocab = _Vocab(tokens, types, scores, {t: i for i, t in enumerate(tokens)})
        spm = kind == "llama"
        model: _Model
        if spm:
            add_space_prefix = bool(metadata.get("tokenizer.ggml.add_space_prefix", True))
            unk_id = _meta_id(metadata, "tokenizer.ggml.unknown_token_id", n, 0)
            model = _SentencePiece(vocab, add_space_prefix, unk_id)
            bos_default, eos_default, add_bos_default = 1, 2, True
        else:
            add_space_prefix = False
            raw_pre = metadata.get("tokenizer.ggml.pre", "default")
            pre = _PRE_ALIASES.get(raw_pre, raw_pre)
            if pre not in PRE_TOKENIZERS:
                known = sorted({*PRE_TOKENIZERS, *_PRE_ALIASES})
                raise TokenizerError(
                    f"tokenizer.ggml.pre = {raw_pre!r} is not a pre-tokenizer xgrad_llm knows (it knows {known}); "
                    "add its regexes to xgrad_llm.tokenizer.PRE_TOKENIZERS"
                )
            merges = _meta_list(metadata, "tokenizer.ggml.merges", None)
            model = _BytePairBPE(vocab, merges, pre)
            bos_default, eos_default, add_bos_default = None, None, pre in _SPECIAL_BOS_PRESETS
        bos_id = _meta_id(metadata, "tokenizer.ggml.bos_token_id", n, bos_default if spm else None)
        eos_id = _meta_id(metadata, "tokenizer.ggml.eos_token_id", n, eos_default if spm else None)
        eot_id = _meta_id(metadata, "tokenizer.ggml.eot_token_id", n, None)
        eom_id = _meta_id(metadata, "tokenizer.ggml.eom_token_id", n, None)
        if eot_id is None:
            eot_id = next((i for t in _EOT_TEXTS if (i := vocab.get(t)) is not None), None)
        eog = {i for i in (eos_id, eot_id, eom_id) if i is not None}
        eog |= {i for t in _EOG_TEXTS if (i := vocab.get(t)) is not None and types[i] == TokenType.CONTROL}
        add_bos = bool(metadata.get("tokenizer.ggml.add_bos_token", add_bos_default))
        add_eos = bool(metadata.get("tokenizer.ggml.add_eos_token", False))
        if add_bos and bos_id is None:
            raise TokenizerError(
                "tokenizer.ggml.add_bos_token is true but the file names no tokenizer.ggml.bos_token_id; "
                "the file's tokenizer is malformed: re-convert it"
            )
        return cls(vocab, model, bos_id, eos_id, eot_id, frozenset(eog), add_bos, add_eos and eos_id is not None,
                   add_space_prefix)  # fmt: skip

    @property
    def vocab_size(self) -> int:
        return len(self._vocab.tokens)

    def _split_special(self, text: str, parse_special: bool) -> list[str | int]:
        """The text cut into plain-text runs and special token ids, longest special text first."""
        parts: list[str | int] = [text]
        for special, token in self._special_all if parse_special else self._special_user:
            if special not in text:
                continue
            cut: list[str | int] = []
            for part in parts:
                if isinstance(part, int) or special not in part:
                    cut.append(part)
                    continue
                pieces = part.split(special)
                for k, piece in enumerate(pieces):
                    if k:
                        cut.append(token)
                    if piece:
                        cut.append(piece)
            parts = cut
        return parts

    def encode(self, text: str, add_bos: bool | None = None, parse_special: bool = True) -> list[int]:
        """Token ids of `text`. `add_bos` (default: as the model file says) prepends BOS; with `parse_special` the
        text of a control token (e.g. `<start_of_turn>`) becomes that token, without it only user-defined tokens
        are matched and control-token text is tokenized as plain text."""
        out: list[int] = []
        if self.add_bos if add_bos is None else add_bos:
            if self.bos_id is None:
                raise TokenizerError(
                    "this vocabulary has no BOS token (tokenizer.ggml.bos_token_id); pass add_bos=False"
                )
            out.append(self.bos_id)
        after_special = True
        for part in self._split_special(text, parse_special):
            if isinstance(part, int):
                out.append(part)
                after_special = True
            else:
                out.extend(self._model.encode_text(part, after_special))
                after_special = False
        if self.add_eos and (add_bos is None or add_bos) and self.eos_id is not None:
            out.append(self.eos_id)
        return out

    def _check_id(self, token_id: int) -> None:
        if not 0 <= token_id < len(self._vocab.tokens):
            raise TokenizerError(f"token id {token_id} is out of range for this {self.vocab_size}-token vocabulary")

    def token_text(self, token_id: int) -> str:
        """The vocabulary's text of a token as the file stores it (e.g. `▁the`, `<0x0A>`, `Ġthe`, `<eos>`)."""
        self._check_id(token_id)
        return self._vocab.tokens[token_id]

    def token_type(self, token_id: int) -> TokenType:
        self._check_id(token_id)
        kind = self._vocab.types[token_id]
        return TokenType(kind) if kind in TokenType._value2member_map_ else TokenType.NORMAL

    def token_bytes(self, token_id: int, special: bool = False) -> bytes:
        """The bytes a token stands for in text; a control token is its text with `special=True`, else nothing."""
        self._check_id(token_id)
        if special and self._vocab.types[token_id] == TokenType.CONTROL:
            return self._vocab.tokens[token_id].encode("utf-8", "surrogateescape")
        return self._model.token_bytes(token_id)

    def decode(self, ids: Iterable[int], special: bool = False) -> str:
        """The text of a list of token ids (invalid UTF-8 becomes U+FFFD). Control tokens (BOS, EOS,
        `<end_of_turn>`, ...) write nothing unless `special=True`. With `add_space_prefix` the space that encoding
        put before the text is dropped again."""
        data = b"".join(self.token_bytes(i, special) for i in ids)
        text = data.decode("utf-8", "replace")
        if self.add_space_prefix and text.startswith(" "):
            text = text[1:]
        return text

    def is_eog(self, token_id: int) -> bool:
        """Whether generation stops at this token: EOS, end of turn or end of message."""
        return token_id in self.eog_ids

    def stream(self, special: bool = False) -> StreamDecoder:
        """A `StreamDecoder` for this vocabulary."""
        return StreamDecoder(self, special)


class StreamDecoder:
    """Decodes tokens one at a time, as they are generated: `push(id)` returns the text that is complete so far
    (a character split over several byte tokens comes out once its last byte arrives), `flush()` the rest at the
    end (an unfinished character becomes U+FFFD). Joined, the outputs equal `tokenizer.decode(ids)` except that no
    leading space is dropped.

    >>> tok = Tokenizer.from_gguf({
    ...     "tokenizer.ggml.model": "llama",
    ...     "tokenizer.ggml.tokens": ["<unk>", "<s>", "</s>", "<0xE2>", "<0x82>", "<0xAC>"],
    ...     "tokenizer.ggml.token_type": [2, 3, 3, 6, 6, 6],
    ...     "tokenizer.ggml.add_space_prefix": False,
    ... })
    >>> s = StreamDecoder(tok)
    >>> [s.push(i) for i in tok.encode("€", add_bos=False)], s.flush()
    (['', '', '€'], '')
    """

    def __init__(self, tokenizer: Tokenizer, special: bool = False) -> None:
        self.tokenizer = tokenizer
        self.special = special
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> str:
        return str(self._decoder.decode(self.tokenizer.token_bytes(token_id, self.special)))

    def flush(self) -> str:
        text = str(self._decoder.decode(b"", final=True))
        self._decoder.reset()
        return text
