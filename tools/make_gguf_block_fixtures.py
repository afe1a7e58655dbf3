#!/usr/bin/python3
"""Writes tests/fixtures/gguf/blocks/: quantized GGUF blocks of every type Osprey reads, and the
values llama.cpp's own Python package (gguf-py, its numpy `gguf.quants.dequantize`) gives them.

Usage: /usr/bin/python3 tools/make_gguf_block_fixtures.py LLAMA_CPP_GGUF_PY_DIR [OUT_DIR]
  LLAMA_CPP_GGUF_PY_DIR: the gguf-py folder of a llama.cpp checkout (it holds gguf/quants.py).
  Needs python3-numpy (scripts/debian-test-tools.txt).

For each type, <TYPE>.blocks holds 4 rows of random blocks (a fixed seed; the f16 scale and
minimum fields are random finite halves of every exponent, both signs, so that rounding in the
scale products shows), and <TYPE>.f32 the 4 rows dequantized by gguf-py, little-endian float32.
tests/formats/gguf_blocks_test.cpp compares Osprey's dequantization with them bit for bit.
"""

import os
import sys

import numpy as np

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
ROWS = 4
# type -> (ggml id, values per block, bytes per block, byte offsets of its f16 fields, blocks per row)
TYPES = {
    "Q4_0": (2, 32, 18, [0], 8),
    "Q4_1": (3, 32, 20, [0, 2], 8),
    "Q5_0": (6, 32, 22, [0], 8),
    "Q5_1": (7, 32, 24, [0, 2], 8),
    "Q8_0": (8, 32, 34, [0], 8),
    "Q4_K": (12, 256, 144, [0, 2], 2),
    "Q5_K": (13, 256, 176, [0, 2], 2),
    "Q6_K": (14, 256, 210, [208], 2),
}


def random_halves(rng, n):
    """n random finite float16 bit patterns: every exponent (subnormals too), both signs."""
    sign = rng.integers(0, 2, n, dtype=np.uint16) << 15
    exponent = rng.integers(0, 31, n, dtype=np.uint16) << 10  # 31 would be inf/NaN
    mantissa = rng.integers(0, 1024, n, dtype=np.uint16)
    return (sign | exponent | mantissa).astype("<u2")


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    sys.path.insert(0, sys.argv[1])
    from gguf.constants import GGMLQuantizationType
    from gguf.quants import dequantize

    out_dir = sys.argv[2] if len(sys.argv) > 2 else os.path.join(ROOT, "tests", "fixtures", "gguf", "blocks")
    os.makedirs(out_dir, exist_ok=True)
    rng = np.random.default_rng(20261205)
    for name, (type_id, per_block, nbytes, half_fields, blocks_per_row) in TYPES.items():
        n_blocks = ROWS * blocks_per_row
        blocks = rng.integers(0, 256, (n_blocks, nbytes), dtype=np.uint8)
        for at in half_fields:
            blocks[:, at:at + 2] = random_halves(rng, n_blocks).view(np.uint8).reshape(n_blocks, 2)
        rows = blocks.reshape(ROWS, blocks_per_row * nbytes)
        values = dequantize(rows, GGMLQuantizationType(type_id)).astype("<f4")
        assert values.shape == (ROWS, blocks_per_row * per_block), values.shape
        rows.tofile(os.path.join(out_dir, name + ".blocks"))
        values.tofile(os.path.join(out_dir, name + ".f32"))
        print(name, values.shape, "finite:", bool(np.isfinite(values).all()))


if __name__ == "__main__":
    main()
