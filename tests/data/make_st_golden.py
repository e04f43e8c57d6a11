#!/usr/bin/env python3
"""Writes the small safetensors goldens in tests/data with the real Python library.

tests/unit/test_safetensors.c writes the same tensors with st_writer and compares the files
byte for byte, and reads the value goldens back. Made with safetensors 0.8.0 and numpy:
    pip install safetensors numpy && python3 tests/data/make_st_golden.py
Data patterns must stay in step with pattern_byte() in test_safetensors.c.
"""
import os

import numpy as np
from safetensors import TensorSpec, serialize_file
from safetensors.numpy import save_file

HERE = os.path.dirname(os.path.abspath(__file__))

# (name, numpy-or-safetensors dtype name, shape, seed). Names exercise the bytewise sort
# (upper case before lower, '.' before '_', "10" before "2") and JSON escaping.
MIXED = [
    ("model.embed", "float32", (3, 4), 1),
    ("layers.10.w", "float16", (2, 3), 2),
    ("layers.2.w", "float16", (5,), 3),
    ("Zeta", "bfloat16", (2, 2), 4),
    ("a_b", "int32", (3,), 5),
    ("a.b", "int32", (1, 1), 6),
    ("big", "int64", (2,), 7),
    ("dbl", "float64", (), 8),
    ("u8", "uint8", (7,), 9),
    ("i8", "int8", (3,), 10),
    ("i16", "int16", (3,), 11),
    ("u16", "uint16", (1,), 12),
    ("u32", "uint32", (2,), 13),
    ("u64", "uint64", (1,), 14),
    ("flags", "bool", (5,), 15),
    ("empty", "float32", (0, 3), 16),
    ("caf\u00e9", "float32", (1,), 17),
    ('q"\\\n\t\x01/', "float16", (1,), 18),
    ("e4", "float8_e4m3fn", (2,), 19),
    ("a_e5", "float8_e5m2", (3,), 20),
]
SIZES = {"float32": 4, "float16": 2, "bfloat16": 2, "int32": 4, "int64": 8, "float64": 8,
         "uint8": 1, "int8": 1, "int16": 2, "uint16": 2, "uint32": 4, "uint64": 8, "bool": 1,
         "float8_e4m3fn": 1, "float8_e5m2": 1}


def pattern(nbytes, seed, is_bool):
    if is_bool:
        return bytes(((i + seed) % 3 == 0) for i in range(nbytes))
    return bytes(((i * 37 + seed * 11 + 5) & 0xFF) for i in range(nbytes))


def write_mixed(path):
    keep, specs = [], {}
    for name, dt, shape, seed in MIXED:
        n = int(np.prod(shape)) if shape else 1
        buf = np.frombuffer(pattern(n * SIZES[dt], seed, dt == "bool"), dtype=np.uint8).copy()
        keep.append(buf)
        specs[name] = TensorSpec(dtype=dt, shape=list(shape), data_ptr=buf.ctypes.data, data_len=buf.nbytes)
    serialize_file(specs, path, metadata={"format": "pt"})


def write_values(path):
    save_file({
        "f32": np.array([[0.0, 1.5, -2.25], [1e-3, 3.0e38, -0.0]], dtype=np.float32),
        "f16": np.array([0.5, -1.25, 65504.0, np.inf, 6.0e-8], dtype=np.float16),
        "i32": np.array([-7, 0, 2147483647], dtype=np.int32),
        "f64": np.array([[1.0 / 3.0]], dtype=np.float64),
        "i8": np.array([-128, 127], dtype=np.int8),
        "u8": np.array([0, 255, 3], dtype=np.uint8),
    }, path, metadata={"format": "pt"})
    # numpy has no bfloat16: pass raw bits 1.0, -2.0, 3.140625, 0.0078125.
    bits = np.array([0x3F80, 0xC000, 0x4049, 0x3C00], dtype=np.uint16)
    serialize_file({"bf16": TensorSpec(dtype="bfloat16", shape=[4], data_ptr=bits.ctypes.data, data_len=8)},
                   path.replace(".safetensors", "_bf16.safetensors"), metadata={"format": "pt"})


if __name__ == "__main__":
    write_mixed(os.path.join(HERE, "st_golden_mixed.safetensors"))
    write_values(os.path.join(HERE, "st_golden_values.safetensors"))
    save_file({}, os.path.join(HERE, "st_golden_empty.safetensors"), metadata={"format": "pt"})
