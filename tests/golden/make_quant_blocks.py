"""Random GGUF quant blocks and their values by gguf-py's numpy dequantizer
(an implementation independent of polar's), for tests/test_quant.c.

    pip install gguf numpy && python3 tests/golden/make_quant_blocks.py

Writes tests/golden/quant_blocks.bin: per type, u32 ggml type, u32 blocks,
u32 elements per block, u32 bytes per block, the raw blocks, then the f32
values (little-endian). The scale fields (f16) are set to finite values of
realistic size (block 0's subnormal, as Q6_K scales of small weights are);
every other byte is random."""
import struct

import numpy as np
from gguf import GGMLQuantizationType as T, GGML_QUANT_SIZES, quants

# type -> byte offsets of the f16 scales inside one block
SCALES = {
    T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2], T.Q8_0: [0],
    T.Q2_K: [80, 82], T.Q3_K: [108], T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208],
    T.IQ4_NL: [0], T.IQ4_XS: [0],  # appended: the blocks of the types above are unchanged
}
BLOCKS = 4

rng = np.random.default_rng(1234)
out = bytearray()
for t, offs in SCALES.items():
    elems, size = GGML_QUANT_SIZES[t]
    raw = rng.integers(0, 256, size=(BLOCKS, size), dtype=np.uint8)
    for b in range(BLOCKS):
        for o in offs:
            scale = rng.uniform(-3e-5, 3e-5) if b == 0 else rng.uniform(-0.05, 0.05)
            raw[b, o:o + 2] = np.frombuffer(np.float16(scale).tobytes(), np.uint8)
    values = quants.dequantize(raw.reshape(-1), t).astype("<f4").reshape(-1)
    assert values.size == BLOCKS * elems and np.all(np.isfinite(values))
    out += struct.pack("<4I", int(t), BLOCKS, elems, size) + raw.tobytes() + values.tobytes()
with open("tests/golden/quant_blocks.bin", "wb") as f:
    f.write(out)
print(len(out), "bytes")
