"""An independent byte-level BPE encoder (GPT-2's published algorithm, in Python), used to
check memra's tokenizer on a real vocabulary.

Usage: python3 bpe_reference.py MODEL.gguf < texts.json > ids.json

Reads tokenizer.ggml.{tokens,token_type,merges,pre} with llama.cpp's gguf-py, splits out
control tokens, applies the `smollm` pre-tokenizer (each digit alone, then the GPT-2 pattern)
and merges by rank. Exits 2 when gguf-py or `regex` is missing (the caller skips).
"""
import json
import sys

try:
    import regex
    from gguf import GGUFReader
except ImportError as e:  # pragma: no cover - environment dependent
    print(f"needs gguf-py and regex: {e}", file=sys.stderr)
    sys.exit(2)

GPT2_PATTERN = regex.compile(
    r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
)


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def field(reader, key):
    f = reader.fields[key]
    if len(f.data) == 1 and key != "tokenizer.ggml.tokens":
        return f.parts[f.data[0]]
    return [f.parts[i] for i in f.data]


def load(path):
    r = GGUFReader(path)
    tokens = [bytes(p).decode("utf-8") for p in field(r, "tokenizer.ggml.tokens")]
    types = [int(p[0]) for p in field(r, "tokenizer.ggml.token_type")]
    merges = [bytes(p).decode("utf-8") for p in field(r, "tokenizer.ggml.merges")]
    pre = bytes(field(r, "tokenizer.ggml.pre")).decode("utf-8")
    return tokens, types, merges, pre


def main():
    tokens, types, merges, pre = load(sys.argv[1])
    assert pre == "smollm", pre
    vocab = {t: i for i, t in enumerate(tokens)}
    ranks = {tuple(m.split(" ", 1)): i for i, m in enumerate(merges)}
    specials = sorted((t for t, ty in zip(tokens, types) if ty in (3, 4)), key=len, reverse=True)
    special_re = regex.compile("|".join(regex.escape(s) for s in specials))
    b2u = bytes_to_unicode()

    def bpe(word):
        parts = list(word)
        while len(parts) > 1:
            pairs = [(ranks.get((a, b), None), i) for i, (a, b) in enumerate(zip(parts, parts[1:]))]
            pairs = [p for p in pairs if p[0] is not None]
            if not pairs:
                break
            _, i = min(pairs)
            parts[i:i + 2] = [parts[i] + parts[i + 1]]
        return [vocab[p] for p in parts]

    def encode_plain(text):
        ids = []
        for chunk in regex.split(r"(\p{N})", text):
            for piece in GPT2_PATTERN.findall(chunk):
                ids += bpe("".join(b2u[b] for b in piece.encode("utf-8")))
        return ids

    def encode(text):
        ids, pos = [], 0
        for m in special_re.finditer(text):
            ids += encode_plain(text[pos:m.start()])
            ids.append(vocab[m.group(0)])
            pos = m.end()
        return ids + encode_plain(text[pos:])

    texts = json.load(sys.stdin)
    json.dump([encode(t) for t in texts], sys.stdout)


if __name__ == "__main__":
    main()
