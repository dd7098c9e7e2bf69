#!/usr/bin/env python3
"""Writes tests/safetensors/corpus/: whole safetensors files, built here from the format's text
(an independent writer: Python's json and struct, not zoe's code). good_* must parse, bad_* must
be refused; expected.json (beside the corpus) gives a phrase each refusal's message contains.
The corpus is the seed set of the safetensors_fuzzer too. Rerun after adding a case:
    python3 tests/safetensors/make_corpus.py
"""
import json
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "corpus")


def file_of(header, data=b"", pad=b" ", length=None):
    """8-byte little-endian length, the header text, padding to 8 bytes, the data section."""
    text = header if isinstance(header, bytes) else header.encode()
    if pad:
        text += pad * ((8 - (8 + len(text)) % 8) % 8)
    n = len(text) if length is None else length
    return struct.pack("<Q", n) + text + data


def t(dtype, shape, begin, end):
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


def j(obj):
    return json.dumps(obj, separators=(",", ":"))


f32 = lambda *v: struct.pack("<%df" % len(v), *v)
cases = {
    # good
    "good_basic": (file_of(j({"__metadata__": {"format": "pt"}, "a": t("F32", [2], 0, 8),
                              "b": t("BF16", [2], 8, 12)}), f32(1.5, -2.0) + bytes([0x80, 0x3f, 0x00, 0xc0])), None),
    "good_header_order_differs": (file_of(j({"b": t("F32", [1], 4, 8), "a": t("F32", [1], 0, 4)}), f32(1, 2)), None),
    "good_scalar_and_empty": (file_of(j({"s": t("F64", [], 0, 8), "e": t("F32", [0, 3], 8, 8),
                                         "z": t("I64", [2, 0], 8, 8)}), struct.pack("<d", 3.25)), None),
    "good_no_tensors": (file_of("{}"), None),
    "good_no_padding": (file_of(j({"a": t("U8", [3], 0, 3)}), b"xyz", pad=None), None),
    "good_null_metadata": (file_of(j({"__metadata__": None, "a": t("I8", [1], 0, 1)}), b"\x01"), None),
    "good_json_whitespace": (file_of('{ "a" : {"dtype":"F32",\n"shape":[1],"data_offsets":[0,4]} }', f32(7)), None),
    # bad
    "bad_overlap": (file_of(j({"a": t("F32", [2], 0, 8), "b": t("F32", [2], 4, 12)}), bytes(12)), "overlaps"),
    "bad_gap": (file_of(j({"a": t("F32", [2], 0, 8), "b": t("F32", [1], 12, 16)}), bytes(16)), "belong to no tensor"),
    "bad_past_end": (file_of(j({"a": t("F32", [2], 0, 8)}), bytes(4)), "lies past the end"),
    "bad_uncovered_tail": (file_of(j({"a": t("F32", [2], 0, 8)}), bytes(12)), "at the end of the data section"),
    "bad_dtype_size": (file_of(j({"a": t("F32", [3], 0, 8)}), bytes(8)), "needs 12"),
    "bad_unknown_dtype": (file_of(j({"a": t("F31", [2], 0, 8)}), bytes(8)), "unknown or unsupported dtype"),
    "bad_sub_byte_dtype": (file_of(j({"a": t("F4", [2], 0, 1)}), bytes(1)), "unknown or unsupported dtype"),
    "bad_negative_dim": (file_of(j({"a": t("F32", [-1], 0, 0)})), "not a non-negative integer"),
    "bad_float_dim": (file_of(j({"a": t("F32", [2.0], 0, 8)}), bytes(8)), "not a non-negative integer"),
    "bad_end_before_begin": (file_of(j({"a": t("F32", [0], 8, 0)}), bytes(8)), "end before they begin"),
    "bad_offsets_three": (file_of(j({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4, 8]}}), bytes(8)), "is not [BEGIN, END]"),
    "bad_offset_too_big": (file_of('{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,18446744073709551616]}}', b"x"), "is not [BEGIN, END]"),
    "bad_numel_overflow": (file_of(j({"a": t("F32", [2**40, 2**40], 0, 0)})), "more than 2^63 elements"),
    "bad_bytes_overflow": (file_of(j({"a": t("F64", [2**62], 0, 0)})), "more than 2^64 bytes"),
    "bad_duplicate_tensor": (file_of('{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}', b"xy"), "duplicate key"),
    "bad_duplicate_field": (file_of('{"a":{"dtype":"U8","dtype":"I8","shape":[1],"data_offsets":[0,1]}}', b"x"), "duplicate key"),
    "bad_unknown_field": (file_of(j({"a": dict(t("U8", [1], 0, 1), stride=[1])}), b"x"), "unknown key"),
    "bad_missing_offsets": (file_of(j({"a": {"dtype": "U8", "shape": [1]}}), b"x"), 'has no "data_offsets"'),
    "bad_entry_not_object": (file_of(j({"a": [1, 2]})), "expected an object"),
    "bad_metadata_value": (file_of(j({"__metadata__": {"step": 3}})), "expected a string"),
    "bad_metadata_array": (file_of(j({"__metadata__": ["x"]})), "__metadata__ is a JSON array"),
    "bad_root_array": (file_of("[1,2]"), "does not begin with '{'"),
    "bad_leading_space": (file_of(" {}"), "does not begin with '{'"),
    "bad_pad_newline": (file_of("{}\n", pad=None), "other than spaces"),
    "bad_trailing_garbage": (file_of('{} x'), "other than spaces"),
    "bad_invalid_json": (file_of('{"a":}'), "not valid JSON"),
    "bad_invalid_utf8": (file_of(b'{"\xff":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', b"x"), "not valid JSON"),
    "bad_deep_nesting": (file_of(j({"a": {"dtype": "U8", "shape": [[[1]]], "data_offsets": [0, 1]}}), b"x"), "nests deeper"),
    "bad_empty_header": (struct.pack("<Q", 0), "does not begin with '{'"),
    "bad_header_len_huge": (struct.pack("<Q", 2**63) + b"{}", "exceeds the format's limit"),
    "bad_header_len_past_end": (struct.pack("<Q", 1000) + b"{}      ", "exceeds the 8 bytes after the length"),
    "bad_short_file": (b"\x02\x00\x00\x00\x00", "fewer than the 8"),
}
# A length that counts 6 NUL bytes after "{}" (only spaces may pad).
cases["bad_pad_nul"] = (struct.pack("<Q", 8) + b"{}" + b"\0" * 6, "other than spaces")

os.makedirs(OUT, exist_ok=True)
for old in os.listdir(OUT):
    os.remove(os.path.join(OUT, old))
expected = {}
for name, (data, phrase) in sorted(cases.items()):
    with open(os.path.join(OUT, name), "wb") as f:
        f.write(data)
    if name.startswith("bad_"):
        expected[name] = phrase
with open(os.path.join(HERE, "corpus_expected.json"), "w") as f:
    json.dump(expected, f, indent=1, sort_keys=True)
    f.write("\n")
print(f"{len(cases)} files in {OUT}")
