#!/usr/bin/env python3
"""Rewrites the wire fuzz seeds (tests/fixtures/fuzz/wire) to another wire version.

A seed is: byte 0 the fuzz mode (bit 0: sealed), a u16 LE AM header length, the AM header
(wire header, page table, and when sealed a 32-byte tag), then the payload (tests/fuzz/fuzz_wire.cpp).
The version lives at bytes 4-5 of the header; a sealed seed's tag covers the header, so it is
recomputed as WireAuth does: HMAC-SHA256(key, channel || header || payload), channel 1 (data),
key = HMAC-SHA256("fuzz-cluster-secret", kWireAuthLabel). Each old tag is checked first, so a
seed this script does not understand is left alone, not silently re-signed.

    python3 scripts/bump_wire_seeds.py --from 3 --to 4
"""
import argparse
import hashlib
import hmac
import pathlib
import re
import struct

ROOT = pathlib.Path(__file__).resolve().parent.parent
SEEDS = ROOT / "tests" / "fixtures" / "fuzz" / "wire"
SECRET = b"fuzz-cluster-secret"
TAG_BYTES = 32


def auth_key() -> bytes:
    header = (ROOT / "include" / "hack" / "net" / "wire.h").read_text()
    label = re.search(r'kWireAuthLabel = "([^"]+)"', header).group(1)
    return hmac.new(SECRET, label.encode(), hashlib.sha256).digest()


def tag(key: bytes, header: bytes, payload: bytes) -> bytes:
    return hmac.new(key, b"\x01" + header + payload, hashlib.sha256).digest()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--from", dest="old", type=int, required=True)
    parser.add_argument("--to", dest="new", type=int, required=True)
    args = parser.parse_args()
    key = auth_key()
    for path in sorted(SEEDS.iterdir()):
        raw = path.read_bytes()
        mode, header_len = raw[0], struct.unpack("<H", raw[1:3])[0]
        header, payload = bytearray(raw[3:3 + header_len]), raw[3 + header_len:]
        if len(header) < 6 or struct.unpack("<H", header[4:6])[0] != args.old:
            print(f"{path.name}: not version {args.old}, left as it is")
            continue
        sealed = bool(mode & 1) and len(header) >= 48 + TAG_BYTES
        if sealed and tag(key, bytes(header[:-TAG_BYTES]), payload) != bytes(header[-TAG_BYTES:]):
            print(f"{path.name}: its tag does not check, left as it is")
            continue
        header[4:6] = struct.pack("<H", args.new)
        if sealed:
            header[-TAG_BYTES:] = tag(key, bytes(header[:-TAG_BYTES]), payload)
        path.write_bytes(raw[:3] + bytes(header) + payload)
        print(f"{path.name}: version {args.old} -> {args.new}{', re-sealed' if sealed else ''}")


if __name__ == "__main__":
    main()
