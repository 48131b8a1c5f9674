#!/usr/bin/env python3
"""Writes the snapshot a `vgpu-agent run` daemon serves on its socket to a file.

  daemon_snapshot.py SOCKET FILE
"""
import socket
import sys

if len(sys.argv) != 3:
    print(__doc__, file=sys.stderr)
    sys.exit(2)
s = socket.socket(socket.AF_UNIX)
s.settimeout(10)
s.connect(sys.argv[1])
buf = b""
while True:
    b = s.recv(1 << 20)
    if not b:
        break
    buf += b
open(sys.argv[2], "wb").write(buf)
