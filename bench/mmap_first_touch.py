#!/usr/bin/env python3
"""First writes to pages of sparse, mmap'ed index files, as a broker's index appends
make them: with and without MADV_RANDOM (issue 20).

Kafka maps its preallocated, sparse .index/.timeindex files and writes entries through
the mapping without MADV_RANDOM; Spate (src/log/index.rs) advises MADV_RANDOM. Without
it, a fault on a hole reads around the page as far as the device's read-ahead
(read_ahead_kb of the disk), zero-filling that much page cache. At 1,000 partitions
nearly every append writes a fresh index page, so this cost is per append.

    bench/mmap_first_touch.py [DIR] [FILES]     # DIR on the disk to test (default /var/tmp)

Prints the disk's read-ahead and, per mode, the time for FILES x 3 first-page writes
with their p50/p99.
"""
import mmap
import os
import shutil
import sys
import time

INDEX_BYTES = 10 * 1024 * 1024  # Kafka's segment.index.bytes default


def read_ahead_kb(path):
    dev = os.stat(path).st_dev
    major, minor = os.major(dev), os.minor(dev)
    sys_dev = f"/sys/dev/block/{major}:{minor}"
    for candidate in (f"{sys_dev}/queue/read_ahead_kb", f"{sys_dev}/../queue/read_ahead_kb"):
        if os.path.exists(candidate):
            return open(candidate).read().strip()
    return "unknown"


def run(directory, files, advice):
    maps = []
    for i in range(files):
        f = open(os.path.join(directory, f"{i}.index"), "w+b")
        f.truncate(INDEX_BYTES)
        m = mmap.mmap(f.fileno(), INDEX_BYTES)
        if advice is not None:
            m.madvise(advice)
        maps.append((f, m))
    lat = []
    start = time.perf_counter()
    for page in range(3):
        for _, m in maps:
            t = time.perf_counter()
            m[page * 4096:page * 4096 + 8] = b"\x00\x00\x00\x01\x00\x00\x10\x00"
            lat.append(time.perf_counter() - t)
    total = time.perf_counter() - start
    for f, m in maps:
        m.close()
        f.close()
    lat.sort()
    return total, lat[len(lat) // 2] * 1e3, lat[int(len(lat) * 0.99)] * 1e3


def main():
    base = sys.argv[1] if len(sys.argv) > 1 else "/var/tmp"
    files = int(sys.argv[2]) if len(sys.argv) > 2 else 1000
    print(f"{base}: read_ahead_kb {read_ahead_kb(base)}; {files} files of {INDEX_BYTES >> 20} MiB, 3 pages each")
    for name, advice in (("default (as Kafka)", None), ("MADV_RANDOM (as Spate)", mmap.MADV_RANDOM)):
        directory = os.path.join(base, f"mmap-first-touch-{os.getpid()}")
        os.makedirs(directory)
        try:
            total, p50, p99 = run(directory, files, advice)
        finally:
            shutil.rmtree(directory)
        print(f"  {name:24} {files * 3} writes in {total:.2f} s; p50 {p50:.3f} ms, p99 {p99:.3f} ms")


if __name__ == "__main__":
    main()
