#!/usr/bin/env python3
"""How fast this machine copies appended bytes into the page cache, over a long write.

Appends 32 KiB writes to PATH at RATE MB/s (as a broker appends), hands each MiB to
writeback right away (sync_file_range(WRITE), Spate's write-behind, so dirty-page
throttling never starts), and with KEEP > 0 drops the pages written more than KEEP MiB
ago (fadvise DONTNEED, Spate's drop-behind). Prints the copy rate of write() alone (MB
per second spent inside write) for each 512 MB.

On the 2-core development VM (2026-12-05; bench/README.md, "Drop-behind"), at 100 MB/s:
KEEP=0 ran at 2.2-2.6 GB/s for the first ~2.5 GB and 85-170 MB/s after, run after run
(page-cache growth into free memory the VM's host had taken back); KEEP=64 or 2048 ran
at 2.0-3.2 GB/s for all 6 GB.

    bench/page_cache_writes.py /data/x.bin 6144 100 0     # PATH TOTAL_MIB RATE_MB/S KEEP_MIB
"""

import ctypes
import os
import sys
import time

SYNC_FILE_RANGE_WRITE = 2
MIB = 1 << 20
REPORT_BYTES = 512 * MIB
WRITE_BYTES = 32 * 1024


def main():
    path, total, rate, keep = sys.argv[1], int(sys.argv[2]) * MIB, float(sys.argv[3]) * 1e6, int(sys.argv[4]) * MIB
    libc = ctypes.CDLL(None, use_errno=True)
    libc.sync_file_range.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    buf = os.urandom(WRITE_BYTES)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        done, in_write, rates, start = 0, 0.0, [], time.perf_counter()
        while done < total:
            t = time.perf_counter()
            os.write(fd, buf)
            in_write += time.perf_counter() - t
            done += WRITE_BYTES
            if done % MIB == 0:
                libc.sync_file_range(fd, done - MIB, MIB, SYNC_FILE_RANGE_WRITE)
                if keep and done > keep + MIB:
                    os.posix_fadvise(fd, done - keep - MIB, MIB, os.POSIX_FADV_DONTNEED)
            ahead = start + done / rate - time.perf_counter()
            if ahead > 0:
                time.sleep(ahead)
            if done % REPORT_BYTES == 0:
                rates.append(f"{REPORT_BYTES / in_write / 1e6:.0f}")
                in_write = 0.0
        print(" ".join(rates), "MB/s of write() time per 512 MB")
    finally:
        os.close(fd)
        os.unlink(path)


if __name__ == "__main__":
    main()
