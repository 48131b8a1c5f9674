"""Reads a vgpu-agent region file (layout 3.x, region/src/layout.rs and docs/region.md) without the
agent: per device the limit and the container-wide reservation, per live slot the pid, held and
context bytes. The byte counts of the container and held words are their low 48 bits (the high
16 are the reservation protocol's tags). Offsets are pinned by const asserts in layout.rs."""
import struct
import sys

MAJOR = 3
DEVICES_AT, DEVICE_SIZE = 160, 64  # RegionHeader.devices, size_of::<DeviceState>()
SLOT_STRIDE_AT, SLOTS_OFFSET_AT = 56, 64  # RegionHeader.slot_stride, .slots_offset
HELD_AT, CONTEXT_AT = 24, 152  # SlotHeader.held, .context_bytes (after 16 held words)
BYTES = (1 << 48) - 1
LIVE = 2  # slot phase (region/src/slots.rs)


def read(path):
    with open(path, "rb") as f:
        data = f.read()
    u32 = lambda off: struct.unpack_from("<I", data, off)[0]
    u64 = lambda off: struct.unpack_from("<Q", data, off)[0]
    assert data[8:16] == b"VGPUREGN", "not a vgpu region"
    major = u64(16) >> 32
    assert major == MAJOR, f"region layout {major}.x, this reader knows {MAJOR}.x"
    slots, devices = u32(32), u32(52)
    stride, first = u64(SLOT_STRIDE_AT), u64(SLOTS_OFFSET_AT)
    out = {"devices": [], "slots": []}
    for d in range(devices):
        base = DEVICES_AT + d * DEVICE_SIZE
        out["devices"].append({"index": d, "limit": u64(base), "reserved": u64(base + 8) & BYTES,
                               "peak": u64(base + 24), "denied": u64(base + 32)})
    for i in range(slots):
        base = first + i * stride
        if base + CONTEXT_AT + 8 * devices > len(data):
            break
        word = u64(base)
        if (word >> 32) & 0xFF != LIVE:
            continue
        out["slots"].append({"index": i, "pid": word & 0xFFFFFFFF,
                             "held": [u64(base + HELD_AT + 8 * d) & BYTES for d in range(devices)],
                             "context": [u64(base + CONTEXT_AT + 8 * d) for d in range(devices)]})
    return out


if __name__ == "__main__":
    import json
    print(json.dumps(read(sys.argv[1])))
