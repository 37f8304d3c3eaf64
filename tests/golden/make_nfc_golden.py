#!/usr/bin/env python3
"""NFC cases for polar's normaliser (tokenizer/unicode.c), from Python's
unicodedata (the same UCD version tokenizer/gen_unicode.py used).

    python3 tests/golden/make_nfc_golden.py      (no packages needed)

Every code point with a canonical decomposition, in NFD and in NFC form;
combining marks in every order after a base; Hangul syllables as jamo;
composition exclusions and singletons; random mixes of all of these.
"""
import json
import os
import random
import sys
import unicodedata

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "nfc.json")


def main():
    rng = random.Random(7)
    decomposable = [chr(c) for c in range(0x110000) if 0xD800 > c or c > 0xDFFF
                    if unicodedata.decomposition(chr(c)) and not unicodedata.decomposition(chr(c)).startswith("<")]
    marks = [chr(c) for c in (0x300, 0x301, 0x302, 0x303, 0x308, 0x30A, 0x323, 0x327, 0x328, 0x331, 0x345, 0x5B0,
                              0x5BC, 0x93C, 0x1AB0, 0x20D0, 0x302A, 0x1D165)]
    bases = list("aAeEoOuUiInNcCsSzZyYwW") + ["\u03b1", "\u0391", "\u03c9", "\u0430", "\u0438", "\u1100",
                                               "\uac00", "\u0627", "\u05d0", "\u0915", "\u3042", "\u304b"]
    cases = []
    for ch in decomposable:
        cases.append(unicodedata.normalize("NFD", ch))
        cases.append(ch)
    for b in bases:
        for _ in range(6):
            cases.append(b + "".join(rng.sample(marks, rng.randint(1, 4))))
    for _ in range(300):  # Hangul: syllables and loose jamo
        l, v, t = rng.randrange(19), rng.randrange(21), rng.randrange(28)
        s = chr(0x1100 + l) + chr(0x1161 + v) + (chr(0x11A7 + t) if t else "")
        cases.append(s if rng.random() < 0.7 else s[::-1])
    pool = decomposable + marks + bases + list(" .,x1")
    for _ in range(1500):
        cases.append(unicodedata.normalize(rng.choice(["NFD", "NFKD", "NFC"]),
                                           "".join(rng.choice(pool) for _ in range(rng.randint(1, 12)))))
    data = {"unicode": unicodedata.unidata_version,
            "cases": [[c, unicodedata.normalize("NFC", c)] for c in cases]}
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump(data, f, ensure_ascii=True, separators=(",", ":"))
    print(OUT, len(cases), "cases, Unicode", unicodedata.unidata_version)


if __name__ == "__main__":
    sys.exit(main())
