#!/usr/bin/env python3
"""Known answers of the sampler's random stream, computed apart from memra's code.

Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11; the
Random123 `philox4x32_R` with R = 10) restated from the paper in Python integers, checked
first against Random123's published known answers, then evaluated at the keys
sampling-gate's `stream` row holds: counter `[step, seq, 0, 0]`, key `[seed_lo, seed_hi]`,
the uniform the top 24 bits of the first word times 2^-24. The seeds are at least 2^32, as
the gate's are, so the key's high word matters.

Prints the rows of `STREAM_KATS` in gates/src/sampling.rs.

Usage: scripts/philox-words.py
"""

M0, M1 = 0xD2511F53, 0xCD9E8D57
W0, W1 = 0x9E3779B9, 0xBB67AE85
MASK = 0xFFFFFFFF


def mulhilo(a, b):
    p = a * b
    return p >> 32, p & MASK


def philox4x32_10(ctr, key):
    c0, c1, c2, c3 = ctr
    k0, k1 = key
    for r in range(10):
        if r:
            k0, k1 = (k0 + W0) & MASK, (k1 + W1) & MASK
        hi0, lo0 = mulhilo(M0, c0)
        hi1, lo1 = mulhilo(M1, c2)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
    return c0, c1, c2, c3


RANDOM123 = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((MASK,) * 4, (MASK,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    (
        (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
        (0xA4093822, 0x299F31D0),
        (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1),
    ),
]

SEED_BASE = 0x5A3B11E000000000

KEYS = [
    (SEED_BASE, 0, 7),
    (SEED_BASE ^ 11, 11, 22),
    (SEED_BASE ^ (5 << 16), 902, 3999),
    (SEED_BASE ^ 0x9E3779B9 ^ 3, 103, 9),
    (0xFFFFFFFF00000001, 207, 1),
    (1 << 32, 0, 0),
    (1 << 63, MASK, MASK),
]


def main():
    for ctr, key, want in RANDOM123:
        got = philox4x32_10(ctr, key)
        assert got == want, (ctr, key, [hex(w) for w in got])
    for seed, seq, step in KEYS:
        w = philox4x32_10((step, seq, 0, 0), (seed & MASK, seed >> 32))[0]
        u = (w >> 8) / 2**24
        print(f"    (0x{seed:016x}, {seq}, {step}, 0x{w:08x}, {u!r}),")


if __name__ == "__main__":
    main()
