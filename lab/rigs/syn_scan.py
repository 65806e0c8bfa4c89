"""A bounded TCP SYN scan into a VIP from many source ports, run inside the lab's client namespace.

    ip netns exec fabric-lab-client python -m lab.rigs.syn_scan --vip V --port 8000 \
        --count 16384 --rate 5000

Every SYN has its own source port (1024-32767, below the kernel's ephemeral range, so no scan
SYN shares a 5-tuple with a real connection of the same namespace), so each one is a new 5-tuple that the XDP program hashes into the Maglev ring
and records in its connection table: COUNT larger than the table fills it. The backends answer
SYN-ACK, which this namespace's kernel answers with RST (no socket owns the port). Raw socket,
root only, paced at RATE packets a second so the veth ring is drained. Prints one JSON line:
{"sent", "seconds", "src", "first_port"}.
"""

from __future__ import annotations

import argparse
import json
import random
import socket
import struct
import sys
import time

LOW, HIGH = 1024, 32768  # source ports used: [LOW, HIGH)


def checksum(data: bytes) -> int:
    if len(data) % 2:
        data += b"\0"
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def syn_segment(src: str, dst: str, sport: int, dport: int, seq: int) -> bytes:
    """A 20-byte TCP header with only SYN set and a correct checksum (the kernel adds the IP header)."""
    header = struct.pack("!HHIIBBHHH", sport, dport, seq, 0, 5 << 4, 0x02, 64240, 0, 0)
    pseudo = socket.inet_aton(src) + socket.inet_aton(dst) + struct.pack("!BBH", 0, socket.IPPROTO_TCP, len(header))
    csum = checksum(pseudo + header)
    return header[:16] + struct.pack("!H", csum) + header[18:]


def source_for(dst: str) -> str:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((dst, 9))
        return s.getsockname()[0]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--vip", required=True)
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--count", type=int, required=True)
    ap.add_argument("--rate", type=float, default=5000.0, help="SYNs a second")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    if not 0 < args.count <= HIGH - LOW:
        ap.error(f"--count must be 1..{HIGH - LOW} (one source port each)")
    src = source_for(args.vip)
    rng = random.Random(args.seed)
    first = rng.randrange(LOW, HIGH)
    sock = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_TCP)
    t0 = time.monotonic()
    for i in range(args.count):
        sport = LOW + (first - LOW + i) % (HIGH - LOW)
        sock.sendto(syn_segment(src, args.vip, sport, args.port, rng.getrandbits(32)), (args.vip, 0))
        ahead = (i + 1) / args.rate - (time.monotonic() - t0)
        if ahead > 0:
            time.sleep(ahead)
    sock.close()
    print(json.dumps({"sent": args.count, "seconds": round(time.monotonic() - t0, 2), "src": src,
                      "first_port": first}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
