#!/usr/bin/env python3
"""A bf16 GGUF for llama.cpp holding exactly the weights hack-run loads from an HF directory
that scripts/gguf_to_hf.py made out of a (quantized) GGUF.

llama.cpp's convert_hf_to_gguf.py would need torch and transformers and rebuilds the
tokenizer from tokenizer.json; here the metadata (hyperparameters, vocab, merges, chat
template) is copied from the source GGUF the HF directory was converted from, so llama.cpp
sees the model as it was published, and every tensor comes from the HF safetensors:
matrices as BF16 bit for bit, 1-D tensors (norms, q/k/v biases) widened to F32 exactly as
llama.cpp's converter keeps them. Tensor names and the set of tensors are the source
GGUF's (hf_tensor_name of gguf_to_hf.py maps them), so qwen2's biases and untied
output.weight come along; q/k rows are not permuted back for qwen2, as gguf_to_hf.py left
them. For llama the HF q/k rows are permuted (gguf_to_hf.py undid llama.cpp's permutation),
so that architecture is refused here: use llama.cpp's own converter for it.

  gguf_from_hf.py --source-gguf Q.gguf --hf-dir models/qwen2.5-coder-1.5b-instruct --out X-bf16.gguf

Run it with llama.cpp's gguf-py first on sys.path (--gguf-py), as llama.cpp's converter does.
"""
import argparse
import json
import struct
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]


def read_safetensors(path: Path):
    """{name: numpy view} over an mmap of one safetensors file; BF16 as uint16 bits."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + n)
    dtypes = {"BF16": np.uint16, "F32": np.float32, "F16": np.float16}
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        if t["dtype"] not in dtypes:
            raise SystemExit(f"{path}: {name} is {t['dtype']}; only BF16, F16, F32 are handled")
        b, e = t["data_offsets"]
        out[name] = (t["dtype"], data[b:e].view(dtypes[t["dtype"]]).reshape(t["shape"]))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--source-gguf", required=True, type=Path)
    ap.add_argument("--hf-dir", required=True, type=Path)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--gguf-py", type=Path, help="llama.cpp's gguf-py (put first on sys.path)")
    a = ap.parse_args()
    if a.gguf_py:
        sys.path.insert(0, str(a.gguf_py))
    import gguf
    sys.path.insert(0, str(REPO / "scripts"))
    from gguf_to_hf import hf_tensor_name

    reader = gguf.GGUFReader(a.source_gguf)
    arch = reader.fields[gguf.Keys.General.ARCHITECTURE].contents()
    if arch != "qwen2":
        raise SystemExit(f"architecture {arch!r}: only 'qwen2' (llama's HF q/k rows are permuted; use "
                         "convert_hf_to_gguf.py)")
    hf = {}
    for st in sorted(a.hf_dir.glob("model*.safetensors")):
        hf.update(read_safetensors(st))

    writer = gguf.GGUFWriter(a.out.with_suffix(".tmp"), arch=arch, use_temp_file=False)
    replaced = {gguf.Keys.General.FILE_TYPE: (gguf.LlamaFileType.MOSTLY_BF16, gguf.GGUFValueType.UINT32)}
    dropped = {gguf.Keys.General.QUANTIZATION_VERSION}
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF.") or field.name in dropped:
            continue
        if field.name in replaced:
            value, vtype = replaced[field.name]
            writer.add_key_value(field.name, int(value), vtype)
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), vtype, sub_type=sub)

    used = set()
    for t in reader.tensors:
        name = hf_tensor_name(t.name, biases=True)
        if name is None or name not in hf:
            raise SystemExit(f"{t.name}: no tensor {name!r} in {a.hf_dir}")
        used.add(name)
        dtype, w = hf[name]
        # GGUF's shape is the reverse of numpy's; the source's says what the HF one must be.
        want = tuple(int(d) for d in reversed(t.shape.tolist()))
        if tuple(w.shape) != want:
            raise SystemExit(f"{t.name}: HF {name} has shape {tuple(w.shape)}, the GGUF {want}")
        if w.ndim == 1:
            if dtype == "BF16":
                w = (w.astype(np.uint32) << 16).view(np.float32)  # exact widening
            writer.add_tensor(t.name, np.ascontiguousarray(w, dtype=np.float32))
        elif dtype == "BF16":
            writer.add_tensor(t.name, w, raw_dtype=gguf.GGMLQuantizationType.BF16)
        else:
            writer.add_tensor(t.name, w)
    unused = sorted(set(hf) - used)
    if unused:
        raise SystemExit(f"HF tensors with no GGUF counterpart: {unused[:5]}")

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file(progress=False)
    writer.close()
    a.out.with_suffix(".tmp").rename(a.out)
    print(f"wrote {a.out} ({a.out.stat().st_size / 1e9:.2f} GB, {len(reader.tensors)} tensors)")


if __name__ == "__main__":
    main()
