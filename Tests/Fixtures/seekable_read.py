"""Reads a segment as a zstd seekable-format reader nobody here wrote does: PyPI's pyzstd.

Usage: seekable_read.py SEGMENT OFFSET
Prints one JSON object: the decompressed size the seek table gives, the SHA-256 of all of it
read in order, and the line read after a seek to OFFSET (a line's first byte).
"""
import hashlib
import json
import sys

import pyzstd

path, offset = sys.argv[1], int(sys.argv[2])
with pyzstd.SeekableZstdFile(path, "r") as f:
    everything = f.read()
    f.seek(offset)
    line = f.readline().rstrip(b"\n").decode()
print(json.dumps({"size": len(everything), "sha256": hashlib.sha256(everything).hexdigest(), "line": line}))
