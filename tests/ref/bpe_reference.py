# Independent byte-level BPE reference for tests/tokenizer_test.cpp, in plain Python (stdlib only): trains
# a small BPE on the public-domain text below, writes Hugging Face tokenizer.json files with it and the token
# ids its own encoder gives for a set of test strings.
#   bpe_reference.py OUT_DIR
# writes OUT_DIR/corpus.txt, OUT_DIR/<config>/tokenizer.json for each config in CONFIGS and OUT_DIR/cases.json:
#   {"strings": [...], "expected": {config: [[ids] per string]}, "expected_special": {config: [[ids]]}
#    (encode with the post-processor's special tokens), "decoded" / "decoded_skip_special": {config: [text]}}
#
# Nothing here shares code or tables with src/models/tokenizer.cpp: the GPT-2 split runs on Python's own
# regex engine (`re`) with \p{L} / \p{N} spelled out as character classes built from `unicodedata`, and the
# encoder merges with the original GPT-2 loop (lowest-ranked pair, every occurrence, repeat) rather than a
# priority queue. The check against the `tokenizers` library itself runs where it is installed (see the
# header of tests/tokenizer_test.cpp).
import json
import os
import re
import sys
import unicodedata

CORPUS = """\
It is a truth universally acknowledged, that a single man in possession of a good fortune, must be in
want of a wife.

However little known the feelings or views of such a man may be on his first entering a neighbourhood,
this truth is so well fixed in the minds of the surrounding families, that he is considered the rightful
property of some one or other of their daughters.

"My dear Mr. Bennet," said his lady to him one day, "have you heard that Netherfield Park is let at last?"

Mr. Bennet replied that he had not.

"But it is," returned she; "for Mrs. Long has just been here, and she told me all about it."

Mr. Bennet made no answer.

"Do you not want to know who has taken it?" cried his wife impatiently.

"_You_ want to tell me, and I have no objection to hearing it."

This was invitation enough.

We the People of the United States, in Order to form a more perfect Union, establish Justice, insure
domestic Tranquility, provide for the common defence, promote the general Welfare, and secure the
Blessings of Liberty to ourselves and our Posterity, do ordain and establish this Constitution for the
United States of America.

Article. I. Section. 1. All legislative Powers herein granted shall be vested in a Congress of the United
States, which shall consist of a Senate and House of Representatives.

Section. 2. The House of Representatives shall be composed of Members chosen every second Year by the
People of the several States, and the Electors in each State shall have the Qualifications requisite for
Electors of the most numerous Branch of the State Legislature. No Person shall be a Representative who
shall not have attained to the Age of twenty five Years, and been seven Years a Citizen of the United
States.

I'm sure you'll see they've said it's done; we'd go, and 'tis she's the one who'll know. DON'T SHOUT!
In 1787, 39 of the 55 delegates signed it: 4,543 words, 7 articles, 27 amendments (as of 1992).
Les misérables : « Ça va ? » dit-elle, très émue — déjà l'été à Orléans, naïve façon.
Größe, Straße, übermäßig; Ærøskøbing, Łódź, Dvořák, İstanbul, ǅemal.
Η γλώσσα μου έδωσαν ελληνική· το σπίτι φτωχικό στις αμμουδιές του Ομήρου.
Съешь же ещё этих мягких французских булок, да выпей чаю. Ёлка и Їжак.
天地玄黄，宇宙洪荒。日月盈昃，辰宿列张。いろはにほへと ちりぬるを カタカナ 한국어 텍스트.
नमस्ते दुनिया, مرحبا بالعالم, שלום עולם.
Emoji: 🙂 👍🏽 ❤️ 🇫🇷 👩‍💻 and math x²+y³=z⁴, ½ ⅓ Ⅻ ٣٤٥ ٤.
Spaces:  two,   three,\tand a tab,\u00a0no-break,\u2003em,\u3000ideographic.


Blank lines above and trailing spaces here   
"""

# Test strings: some from the corpus, most not (so unseen words exercise partial merges), and the edges of
# the split pattern and of added-token matching.
STRINGS = [
    "",
    " ",
    "   ",
    "\n",
    "\n\n\n",
    "Hello world",
    " Hello  world ",
    "It is a truth universally acknowledged, that a single man in possession of a good fortune",
    "The People of the United States shall establish Justice.",
    "I'm sure you'll see they've said it's done; we'd go, 'tis she's. DON'T 'S 'Ll",
    "won't can't shouldn't o'clock rock'n'roll '' 's",
    "In 1787, 39 of 55 delegates signed; 1234567890 and 3.14159 and 1,000,000.",
    "x²+y³=z⁴ ½ ⅓ Ⅻ ٣٤٥ 𝟙𝟚",
    "Les misérables : « Ça va ? » dit-elle, très émue — déjà l'été.",
    "Größe, Straße, übermäßig; Ærøskøbing, Łódź, Dvořák, İstanbul, ǅemal",
    "Η γλώσσα μου έδωσαν ελληνική.",
    "Съешь же ещё этих мягких французских булок, да выпей чаю.",
    "天地玄黄，宇宙洪荒。日月盈昃 いろは カタカナ 한국어",
    "नमस्ते दुनिया مرحبا بالعالم שלום",
    "🙂 👍🏽 ❤️ 🇫🇷 👩‍💻!!",
    "a  b   c\n\n\tend  \n",
    "tab\there\r\nwindows\r\n  \n x",
    "\u00a0no-break\u2003em\u3000ideographic\u2028line\u0085next",
    "control\x1cchars\x1f\x00and\x7fdel",
    "C++ & Rust: fn main() { println!(\"hi\"); } // <b>tags</b> $100 #1 @user",
    "<|endoftext|>",
    "a<|endoftext|>b",
    "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|><|im_end|><|endoftext|>",
    "<|endoftext|  <|endoftext| |>",
    "please <mask> this  <mask>and <mask>",
    "[[mgn]] tok[[mgn]]x",
    "xyzzy said xyzzy, not xyzzyx or axyzzy: (xyzzy)",
    "Netherfield Park is let at last?    ",
    "  leading spaces and trailing\t",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "thethethethe the the  the   the",
]

# Added tokens: ids 0..N-1 before the byte alphabet, as SmolLM2 has them.
ADDED = [
    {"content": "<|endoftext|>", "special": True},
    {"content": "<|im_start|>", "special": True},
    {"content": "<|im_end|>", "special": True},
    {"content": "<mask>", "special": True, "lstrip": True},
    {"content": "[[mgn]]", "special": False, "normalized": True},
    {"content": "xyzzy", "special": False, "normalized": False, "single_word": True},
]

NUM_MERGES = 300

# ---- Unicode classes (the regex's \s, \p{L}, \p{N})

# \s of Oniguruma / Rust regex: the White_Space property (not str.isspace, which adds U+001C..U+001F).
WHITE_SPACE = [(0x09, 0x0D), (0x20, 0x20), (0x85, 0x85), (0xA0, 0xA0), (0x1680, 0x1680), (0x2000, 0x200A),
               (0x2028, 0x2029), (0x202F, 0x202F), (0x205F, 0x205F), (0x3000, 0x3000)]


def ranges_of(pred):
    out, lo = [], None
    for cp in range(0x110000):
        if pred(cp):
            if lo is None:
                lo = cp
        elif lo is not None:
            out.append((lo, cp - 1))
            lo = None
    if lo is not None:
        out.append((lo, 0x10FFFF))
    return out


def char_class(ranges):
    def esc(cp):
        return "\\U%08x" % cp
    return "".join(esc(a) if a == b else esc(a) + "-" + esc(b) for a, b in ranges)


def category_is(prefix):
    return lambda cp: unicodedata.category(chr(cp)).startswith(prefix)


L = char_class(ranges_of(category_is("L")))
N = char_class(ranges_of(category_is("N")))
S = char_class(WHITE_SPACE)
GPT2_SPLIT = re.compile(
    rf"'s|'t|'re|'ve|'m|'ll|'d| ?[{L}]+| ?[{N}]+| ?[^{S}{L}{N}]+|[{S}]+(?![^{S}])|[{S}]+")
WORD_CHAR = re.compile(r"\w")  # single_word boundaries (ASCII cases only in STRINGS)


def is_space(ch):
    return any(a <= ord(ch) <= b for a, b in WHITE_SPACE)


def is_number(ch):
    return unicodedata.category(ch).startswith("N")


# ---- byte-level alphabet (GPT-2's bytes_to_unicode)


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


BYTE_TO_CHAR = bytes_to_unicode()
CHAR_TO_BYTE = {c: b for b, c in BYTE_TO_CHAR.items()}


def byte_level(s):
    return "".join(BYTE_TO_CHAR[b] for b in s.encode("utf-8"))


# ---- pre-tokenization


def digits_split(pieces, individual):
    out = []
    for p in pieces:
        cur = ""
        for ch in p:
            if is_number(ch):
                if individual:
                    if cur:
                        out.append(cur)
                    out.append(ch)
                    cur = ""
                    continue
                if cur and not is_number(cur[-1]):
                    out.append(cur)
                    cur = ""
            elif cur and is_number(cur[-1]):
                out.append(cur)
                cur = ""
            cur += ch
        if cur:
            out.append(cur)
    return out


def pre_tokenize(text, cfg):
    pieces = [text]
    if cfg["digits"] is not None:
        pieces = digits_split(pieces, cfg["digits"])
    out = []
    for p in pieces:
        if cfg["add_prefix_space"] and not p.startswith(" "):
            p = " " + p
        out.extend(GPT2_SPLIT.findall(p))
        assert "".join(GPT2_SPLIT.findall(p)) == p
    return [byte_level(p) for p in out]


# ---- training


def train(text, num_merges):
    words = {}
    for piece in pre_tokenize(text, {"digits": None, "add_prefix_space": False}):
        words[piece] = words.get(piece, 0) + 1
    words = {tuple(w): c for w, c in words.items()}
    merges = []
    for _ in range(num_merges):
        pairs = {}
        for w, c in words.items():
            for a, b in zip(w, w[1:]):
                pairs[(a, b)] = pairs.get((a, b), 0) + c
        if not pairs:
            break
        best = min(pairs, key=lambda p: (-pairs[p], p))
        merges.append(best)
        merged = {}
        for w, c in words.items():
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and (w[i], w[i + 1]) == best:
                    out.append(w[i] + w[i + 1])
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            merged[tuple(out)] = merged.get(tuple(out), 0) + c
        words = merged
    return merges


# ---- encoding


class Encoder:
    def __init__(self, vocab, merges, added, cfg):
        self.vocab = vocab
        self.ranks = {m: i for i, m in enumerate(merges)}
        self.added = added
        self.cfg = cfg

    def bpe(self, word):
        parts = list(word)
        while len(parts) > 1:
            pairs = [(self.ranks.get((a, b)), i) for i, (a, b) in enumerate(zip(parts, parts[1:]))]
            pairs = [p for p in pairs if p[0] is not None]
            if not pairs:
                break
            j = min(pairs)[1]
            pair = (parts[j], parts[j + 1])
            out, i = [], 0
            while i < len(parts):
                if i + 1 < len(parts) and (parts[i], parts[i + 1]) == pair:
                    out.append(pair[0] + pair[1])
                    i += 2
                else:
                    out.append(parts[i])
                    i += 1
            parts = out
        return [self.vocab[p] for p in parts]

    def split_added(self, text, tokens):
        """HF's AddedVocabulary::find_matches: leftmost-longest matches, then single_word/lstrip/rstrip."""
        segs, pos, start_offset = [], 0, 0
        while pos < len(text):
            best = None
            for t in tokens:
                c = t["content"]
                if text.startswith(c, pos) and (best is None or len(c) > len(best["content"])):
                    best = t
            if best is None:
                pos += 1
                continue
            start, stop = pos, pos + len(best["content"])
            pos = stop
            if best.get("single_word"):
                before = start == 0 or not WORD_CHAR.match(text[start - 1])
                after = stop == len(text) or not WORD_CHAR.match(text[stop])
                if not (before and after):
                    continue
            if best.get("lstrip"):
                s = start
                while s > 0 and is_space(text[s - 1]):
                    s -= 1
                start = max(s, start_offset)
            if best.get("rstrip"):
                while stop < len(text) and is_space(text[stop]):
                    stop += 1
                pos = stop
            if start_offset < start:
                segs.append((None, text[start_offset:start]))
            segs.append((best, text[start:stop]))
            start_offset = stop
        if start_offset < len(text):
            segs.append((None, text[start_offset:]))
        return segs

    def encode(self, text, add_special=False):
        raw = [t for t in self.added if not t.get("normalized", not t["special"])]
        norm = [t for t in self.added if t.get("normalized", not t["special"])]
        ids = []
        for tok, seg in self.split_added(text, raw):
            if tok is not None:
                ids.append(tok["id"])
                continue
            for tok2, seg2 in self.split_added(seg, norm):
                if tok2 is not None:
                    ids.append(tok2["id"])
                    continue
                for piece in pre_tokenize(seg2, self.cfg):
                    ids.extend(self.bpe(piece))
        if add_special and self.cfg.get("template"):
            pre, post = self.cfg["template"]
            ids = [self.vocab_added(t) for t in pre] + ids + [self.vocab_added(t) for t in post]
        return ids

    def vocab_added(self, content):
        return next(t["id"] for t in self.added if t["content"] == content)

    def decode(self, ids, skip_special):
        id_to_token = {i: t for t, i in self.vocab.items()}
        added = {t["id"]: t for t in self.added}
        out = b""
        for i in ids:
            if i in added:
                if skip_special and added[i]["special"]:
                    continue
                tok = added[i]["content"]
            else:
                tok = id_to_token[i]
            if all(c in CHAR_TO_BYTE for c in tok):
                out += bytes(CHAR_TO_BYTE[c] for c in tok)
            else:
                out += tok.encode("utf-8")
        return out.decode("utf-8", errors="replace")


# ---- tokenizer.json


def byte_level_pre(add_prefix_space):
    return {"type": "ByteLevel", "add_prefix_space": add_prefix_space, "trim_offsets": True, "use_regex": True}


# name -> (pre-tokenizer config for the encoder, merges written as "a b" strings or [a, b] pairs)
CONFIGS = {
    "gpt2": {"digits": None, "add_prefix_space": False, "pairs": False, "template": None},
    "smollm": {"digits": True, "add_prefix_space": False, "pairs": True, "template": None},
    "prefix": {"digits": False, "add_prefix_space": True, "pairs": False,
               "template": (["<|im_start|>"], ["<|endoftext|>"])},
}


def tokenizer_json(vocab, merges, added, cfg):
    pre = byte_level_pre(cfg["add_prefix_space"])
    if cfg["digits"] is not None:
        pre = {"type": "Sequence",
               "pretokenizers": [{"type": "Digits", "individual_digits": cfg["digits"]}, pre]}
    if cfg["template"]:
        first, last = cfg["template"]

        def special(t):
            return {"SpecialToken": {"id": t, "type_id": 0}}
        post = {"type": "TemplateProcessing",
                "single": [special(t) for t in first] + [{"Sequence": {"id": "A", "type_id": 0}}] +
                          [special(t) for t in last],
                "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
                "special_tokens": {t: {"id": t, "ids": [next(a["id"] for a in added if a["content"] == t)],
                                       "tokens": [t]} for t in first + last}}
    else:
        post = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [{"id": t["id"], "content": t["content"], "single_word": t.get("single_word", False),
                          "lstrip": t.get("lstrip", False), "rstrip": t.get("rstrip", False),
                          "normalized": t.get("normalized", not t["special"]), "special": t["special"]}
                         for t in added],
        "normalizer": None,
        "pre_tokenizer": pre,
        "post_processor": post,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {
            "type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
            "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
            "vocab": vocab,
            "merges": [list(m) if cfg["pairs"] else m[0] + " " + m[1] for m in merges],
        },
    }


def main():
    out_dir = sys.argv[1]
    merges = train(CORPUS, NUM_MERGES)
    added = [dict(t, id=i) for i, t in enumerate(ADDED)]
    vocab = {t["content"]: t["id"] for t in added}
    for b in range(256):
        vocab[BYTE_TO_CHAR[b]] = len(vocab)
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    with open(os.path.join(out_dir, "corpus.txt"), "w", encoding="utf-8") as f:
        f.write(CORPUS)
    cases = {"strings": STRINGS, "num_merges": len(merges), "expected": {}, "expected_special": {},
             "decoded": {}, "decoded_skip_special": {}}
    for name, cfg in CONFIGS.items():
        os.makedirs(os.path.join(out_dir, name), exist_ok=True)
        with open(os.path.join(out_dir, name, "tokenizer.json"), "w", encoding="utf-8") as f:
            json.dump(tokenizer_json(vocab, merges, added, cfg), f, ensure_ascii=False, indent=1)
        enc = Encoder(vocab, merges, added, cfg)
        ids = [enc.encode(s) for s in STRINGS]
        # Text survives the round trip unless a prefix space was added or an lstrip token ate spaces.
        if not cfg["add_prefix_space"]:
            for s, i in zip(STRINGS, ids):
                assert "<mask>" in s or enc.decode(i, False) == s, (name, s)
        cases["expected"][name] = ids
        cases["expected_special"][name] = [enc.encode(s, True) for s in STRINGS]
        cases["decoded"][name] = [enc.decode(i, False) for i in ids]
        cases["decoded_skip_special"][name] = [enc.decode(i, True) for i in ids]
    with open(os.path.join(out_dir, "cases.json"), "w", encoding="utf-8") as f:
        json.dump(cases, f, ensure_ascii=False, indent=1)


if __name__ == "__main__":
    main()
