"""
A smaller card, simulated on the one that is lent (issue 62): holds all but LEAVE GiB of GPU 0's free memory until it
is killed, so that the ranks that run beside it have no more than a card of that size would give them.
    python3 benchmarks/hold_gpu.py LEAVE_GIB &     (prints "holding N GiB, leaving M GiB free" once it holds them)
"""
import signal
import sys
import time

import torch

leave = float(sys.argv[1]) * 2**30
free, total = torch.cuda.mem_get_info()
held = torch.empty(int(free - leave), dtype=torch.uint8, device="cuda")
free_now, _ = torch.cuda.mem_get_info()
print(f"holding {held.numel() / 2**30:.2f} GiB of {total / 2**30:.2f}, leaving {free_now / 2**30:.2f} GiB free",
      flush=True)
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
while True:
    time.sleep(1)
