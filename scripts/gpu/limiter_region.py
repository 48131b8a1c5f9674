"""Reads a vgpu-agent region file (layout 1.0, docs/region.md) without the agent: per device the
limit and the container-wide reservation, per live slot the pid, held and context bytes."""
import struct
import sys

HEADER, SLOT = 4096, 325824
DEVICES_AT, DEVICE_SIZE = 160, 64
HELD_AT, CONTEXT_AT = 64, 192


def read(path):
    with open(path, "rb") as f:
        data = f.read()
    u32 = lambda off: struct.unpack_from("<I", data, off)[0]
    u64 = lambda off: struct.unpack_from("<Q", data, off)[0]
    assert data[8:16] == b"VGPUREGN", "not a vgpu region"
    slots, devices = u32(32), u32(52)
    out = {"devices": [], "slots": []}
    for d in range(devices):
        base = DEVICES_AT + d * DEVICE_SIZE
        out["devices"].append({"index": d, "limit": u64(base), "reserved": u64(base + 8),
                               "peak": u64(base + 24), "denied": u64(base + 32)})
    for i in range(slots):
        base = HEADER + i * SLOT
        if base + 320 > len(data):
            break
        word = u64(base)
        if (word >> 32) & 0xFF != 2:  # LIVE
            continue
        out["slots"].append({"index": i, "pid": word & 0xFFFFFFFF,
                             "held": [u64(base + HELD_AT + 8 * d) for d in range(devices)],
                             "context": [u64(base + CONTEXT_AT + 8 * d) for d in range(devices)]})
    return out


if __name__ == "__main__":
    import json
    print(json.dumps(read(sys.argv[1])))
