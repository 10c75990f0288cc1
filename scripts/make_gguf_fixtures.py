#!/usr/bin/env python3
"""GGUF fixtures for the native reader and the block-type kernels, written by gguf-py (an
implementation independent of ours: its GGUFWriter lays the file out, its quants module
dequantizes).

    python3 scripts/make_gguf_fixtures.py [--out tests/fixtures/gguf]

Writes blocks.gguf:
  - metadata of every value type: hack.u8 ... hack.f64, hack.bool, hack.str, an array of
    each scalar type, an array of strings, and a nested array (hack.nested: [[1, 2], [3]]);
    general.alignment 64;
  - for each block type T in Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K: tensor `T` of shape
    [3 rows, 512 elements] (ggml ne = [512, 3]) with random blocks whose f16 scales include
    extremes (65504, the smallest subnormal 2^-24, 0, negative values, ordinary ones), and an
    F32 tensor `T.expected` of the same shape: gguf.quants.dequantize of those bytes.
The scales are set explicitly (random bytes there could be inf or NaN).
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as Q, GGUFValueType as V, GGUFWriter, quants

SEED = 48
ROWS, COLS = 3, 512
EXTREME_SCALES = np.array([65504.0, 2.0 ** -24, 0.0, -1.5, 6.1e-5, -65504.0, 1e-3, 0.02], dtype=np.float16)

# (type, bytes per block, elements per block, byte offsets of the f16 fields)
TYPES = [
    (Q.Q4_0, 18, 32, [0]),
    (Q.Q4_1, 20, 32, [0, 2]),
    (Q.Q5_0, 22, 32, [0]),
    (Q.Q5_1, 24, 32, [0, 2]),
    (Q.Q8_0, 34, 32, [0]),
    (Q.Q4_K, 144, 256, [0, 2]),
    (Q.Q5_K, 176, 256, [0, 2]),
    (Q.Q6_K, 210, 256, [208]),
]


def random_blocks(rng: np.random.Generator, block_bytes: int, block_elems: int, half_offsets: list[int]) -> np.ndarray:
    blocks = ROWS * COLS // block_elems
    raw = rng.integers(0, 256, size=(blocks, block_bytes), dtype=np.uint8)
    for b in range(blocks):
        for k, off in enumerate(half_offsets):
            if b < len(EXTREME_SCALES) and k == 0:
                h = EXTREME_SCALES[b]
            else:
                h = np.float16(rng.normal(0, 0.05))
            raw[b, off:off + 2] = np.frombuffer(np.float16(h).tobytes(), dtype=np.uint8)
    return raw.reshape(ROWS, -1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent.parent / "tests/fixtures/gguf")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(SEED)
    w = GGUFWriter(str(args.out / "blocks.gguf"), arch="hack-fixture")
    w.data_alignment = 64
    w.add_uint32("general.alignment", 64)
    w.add_uint8("hack.u8", 200)
    w.add_int8("hack.i8", -100)
    w.add_uint16("hack.u16", 60000)
    w.add_int16("hack.i16", -30000)
    w.add_uint32("hack.u32", 4000000000)
    w.add_int32("hack.i32", -2000000000)
    w.add_uint64("hack.u64", 2 ** 63 + 5)
    w.add_int64("hack.i64", -(2 ** 62))
    w.add_float32("hack.f32", 0.15625)
    w.add_float64("hack.f64", -1e300)
    w.add_bool("hack.bool", True)
    w.add_string("hack.str", "héllo, gguf")
    for name, vt, vals in [("u8", V.UINT8, [1, 255]), ("i8", V.INT8, [-1, 127]), ("u16", V.UINT16, [65535]),
                           ("i16", V.INT16, [-2, 3]), ("u32", V.UINT32, [7]), ("i32", V.INT32, [-7, 8]),
                           ("u64", V.UINT64, [2 ** 64 - 1]), ("i64", V.INT64, [-9]),
                           ("f32", V.FLOAT32, [0.5, -2.0]), ("f64", V.FLOAT64, [0.25]), ("bool", V.BOOL, [True, False])]:
        w.add_key_value(f"hack.array.{name}", vals, V.ARRAY, sub_type=vt)
    w.add_array("hack.array.str", ["a", "", "ĠHello"])
    w.add_key_value("hack.nested", [[1, 2], [3]], V.ARRAY)
    for qtype, block_bytes, block_elems, halves in TYPES:
        raw = random_blocks(rng, block_bytes, block_elems, halves)
        expected = quants.dequantize(raw, qtype).astype(np.float32).reshape(ROWS, COLS)
        w.add_tensor(qtype.name, raw, raw_dtype=qtype)
        w.add_tensor(qtype.name + ".expected", expected)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
