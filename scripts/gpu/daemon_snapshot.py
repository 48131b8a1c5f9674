#!/usr/bin/env python3
"""The snapshot a `vgpu-agent run` daemon serves on its socket: `read(socket)` gives its bytes;
run as a script, it writes them to a file.

  daemon_snapshot.py SOCKET FILE
"""
import socket
import sys


def read(path, timeout=10):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        s.connect(path)
        body = b""
        while True:
            b = s.recv(1 << 20)
            if not b:
                break
            body += b
    finally:
        s.close()
    return body


if __name__ == "__main__":
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    open(sys.argv[2], "wb").write(read(sys.argv[1]))
