"""IncrementalDetokenizer on the embedded tokenizer (SmolLM2: byte-level BPE, 17 special
tokens, no clean-up of spaces): the deltas plus flush() are exactly tokenizer.decode."""

from __future__ import annotations

import random

import pytest

from specadapt.native_reference.detok import IncrementalDetokenizer

TEXTS = [
    "Hello, world! The quick brown fox jumps over the lazy dog.",
    "café naïve résumé, Ångström, São Paulo, Zürich, e\u0301 (combining acute)",
    "日本語のテキストと中文文本，한국어 텍스트도 있습니다。",
    "emoji: 😀🎉👍🏽 family 👨\u200d👩\u200d👧\u200d👦 flags 🇯🇵🇫🇷 keycap 1\ufe0f\u20e3",
    "mixed: x = 𝔸 ∑ ∫ → ≤ ≥ ∞ 𝄞 ❤️ and a literal \ufffd replacement char",
    "  leading and\ttabs\nnewlines\n\n  trailing  ",
    "",
]


@pytest.fixture(scope="module")
def tok(embedded_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(embedded_dir), local_files_only=True)


def stream(tok, ids: list[int], rng: random.Random, skip: bool = True, sizes=(1, 4)):
    """Feed ``ids`` in chunks of ``sizes`` ids; return (deltas, flush, detokenizer)."""
    detok = IncrementalDetokenizer(tok, skip_special_tokens=skip)
    deltas, i = [], 0
    while i < len(ids):
        n = rng.randint(*sizes)
        deltas.append(detok.add(ids[i:i + n]))
        i += n
    return deltas, detok.flush(), detok


def check(tok, ids: list[int], rng: random.Random, skip: bool = True) -> list[str]:
    deltas, rest, detok = stream(tok, ids, rng, skip)
    want = tok.decode(ids, skip_special_tokens=skip)
    assert "".join(deltas) + rest == want
    assert detok.text == want
    return deltas


def single_byte_ids(tok) -> list[int]:
    """The byte tokens (the base of byte-level BPE): one character each, not special. Bytes
    that never occur in UTF-8 (0xC0, 0xC1, 0xF5..0xFF) may be missing from the vocabulary."""
    special = set(tok.all_special_ids) | {int(i) for i in tok.added_tokens_decoder}
    ids = [i for i, s in enumerate(tok.convert_ids_to_tokens(list(range(2000))))
           if len(s) == 1 and i not in special]
    assert 200 < len(ids) <= 256
    return ids


@pytest.mark.parametrize("text", TEXTS)
def test_real_texts_in_chunks_of_one_to_four(tok, text):
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids) == text  # the texts round-trip: equality below is with the text itself
    for seed in range(20):
        deltas = check(tok, ids, random.Random(seed))
        # held back only while a character is unfinished: no delta ends half a character
        assert not any(d.endswith("\ufffd") for d in deltas if not text.endswith("\ufffd"))


def test_one_id_at_a_time_emits_each_complete_word_at_once(tok):
    ids = tok.encode("the cat sat on the mat", add_special_tokens=False)
    detok = IncrementalDetokenizer(tok)
    deltas = [detok.add([i]) for i in ids]
    assert deltas == [tok.decode([i]) for i in ids]
    assert all(deltas) and detok.flush() == ""


def test_a_multibyte_character_waits_for_its_last_byte(tok):
    ids = tok.encode("a😀", add_special_tokens=False)
    assert len(ids) >= 3  # "a" and the emoji's bytes in more than one token
    detok = IncrementalDetokenizer(tok)
    assert detok.add(ids[:1]) == "a"
    assert [detok.add([i]) for i in ids[1:-1]] == [""] * (len(ids) - 2)
    assert detok.add(ids[-1:]) == "😀"
    assert detok.text == "a😀" and detok.flush() == ""


@pytest.mark.parametrize("skip", [True, False])
def test_random_id_streams(tok, skip):
    vocab = len(tok)
    for seed in range(150):
        rng = random.Random(seed)
        ids = [rng.randrange(vocab) for _ in range(rng.randint(0, 80))]
        check(tok, ids, rng, skip)


@pytest.mark.parametrize("skip", [True, False])
def test_random_byte_streams_with_special_tokens(tok, skip):
    """Mostly single-byte tokens, >= 0x80 ones too: unfinished, invalid and interleaved
    UTF-8 sequences, special tokens between the bytes of one character, ASCII, merges."""
    pool = single_byte_ids(tok) + list(tok.added_tokens_decoder) * 4 + list(range(300, 340))
    for seed in range(300):
        rng = random.Random(seed)
        ids = [rng.choice(pool) for _ in range(rng.randint(0, 60))]
        check(tok, ids, rng, skip)


@pytest.mark.parametrize("skip", [True, False])
def test_special_tokens_in_the_middle(tok, skip):
    im_start, im_end, eot = (tok.convert_tokens_to_ids(t) for t in ("<|im_start|>", "<|im_end|>", "<|endoftext|>"))
    for text in TEXTS:
        ids = tok.encode(text, add_special_tokens=False)
        for seed in range(10):
            rng = random.Random(seed)
            mixed = list(ids)
            for _ in range(3):  # anywhere, between the bytes of one character too
                mixed.insert(rng.randint(0, len(mixed)), rng.choice([im_start, im_end, eot]))
            check(tok, mixed, rng, skip)
    # a special token between the two halves of an emoji: skipped, the emoji is whole
    emoji = tok.encode("😀", add_special_tokens=False)
    assert len(emoji) >= 2
    ids = emoji[:1] + [im_end] + emoji[1:]
    detok = IncrementalDetokenizer(tok, skip_special_tokens=True)
    assert [detok.add([i]) for i in ids][-1] == "😀" == tok.decode(ids, skip_special_tokens=True)


def test_special_tokens_alone(tok):
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    detok = IncrementalDetokenizer(tok)
    assert detok.add([im_end, im_end]) == "" and detok.flush() == "" and detok.text == ""
    detok = IncrementalDetokenizer(tok, skip_special_tokens=False)
    assert detok.add([im_end]) == "<|im_end|>"


def test_unfinished_character_at_the_end_comes_out_of_flush_as_a_full_decode_has_it(tok):
    emoji = tok.encode("ok😀", add_special_tokens=False)
    ids = emoji[:-1]  # the emoji's last byte never comes
    detok = IncrementalDetokenizer(tok)
    assert detok.add(ids) == "ok"  # the ids of the unfinished emoji are held back
    rest = detok.flush()
    assert rest == "\ufffd" and "ok" + rest == tok.decode(ids)
    assert detok.flush() == "" and detok.text == "ok\ufffd"


def test_a_chunk_ending_in_an_unfinished_character_emits_up_to_it(tok):
    ids = tok.encode("한국어 텍스트", add_special_tokens=False)
    pieces = [tok.decode(ids[:i]) for i in range(len(ids) + 1)]
    cuts = [i for i in range(1, len(ids)) if pieces[i].endswith("\ufffd")]
    assert cuts  # Hangul syllables are split across ids
    for i in cuts:
        detok = IncrementalDetokenizer(tok)
        first = detok.add(ids[:i])
        clean = max(j for j in range(i) if not pieces[j].endswith("\ufffd"))
        assert first == pieces[clean]  # everything before the unfinished syllable
        assert first + detok.add(ids[i:]) + detok.flush() == "한국어 텍스트"


def test_empty_add_and_continuing_after_flush(tok):
    detok = IncrementalDetokenizer(tok)
    assert detok.add([]) == "" and detok.flush() == "" and detok.text == ""
    first = tok.encode("Hello", add_special_tokens=False)
    more = tok.encode(" world", add_special_tokens=False)
    assert detok.add(first) == "Hello"
    assert detok.flush() == ""
    assert detok.add(more) == " world" and detok.text == "Hello world"


def test_windows_stay_short_on_a_long_stream(tok):
    """Each add decodes the previous delta's ids and the new ones, not the whole stream."""
    text = " ".join(TEXTS) * 8
    ids = tok.encode(text, add_special_tokens=False)
    assert len(ids) > 1000
    lengths = []

    class Counting:
        def decode(self, chunk, skip_special_tokens=True):
            lengths.append(len(chunk))
            return tok.decode(chunk, skip_special_tokens=skip_special_tokens)

    deltas, rest, _ = stream(Counting(), ids, random.Random(0))
    assert "".join(deltas) + rest == text
    assert max(lengths) <= 14  # the previous delta's ids and the new ones: 2 x (4 + 3 held back)
    assert sum(lengths) < 6 * len(ids)
