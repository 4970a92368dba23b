"""One line per log in a folder tree: what ran and its headline figures, from the RESULT/BASELINE lines.
    python benchmarks/brief.py DIR"""
import json
import sys
from pathlib import Path

for log in sorted(Path(sys.argv[1]).rglob("*.log")):
    for line in log.read_text(errors="replace").splitlines():
        tag, _, payload = line.partition(" {")
        if tag.endswith(("RESULT", "BASELINE")) and (tag.endswith("BASELINE") or '"rank": 0,' in payload):
            r = json.loads("{" + payload)
            mfu = f"{100 * r['mfu']:.1f}%" if r.get("mfu") else "-"
            losses = " ".join(f"{x:.2f}" for x in r.get("losses", []))
            print(f"{str(log.relative_to(sys.argv[1])):42s} mb {r.get('micro_batch')} ranks {r.get('world_size')} "
                  f"peak {r.get('peak_mem_bytes', 0) / 2**30:6.2f} GiB  tok/s {r.get('tokens_per_s') or 0:9,.0f}  "
                  f"mfu {mfu:>6}  ready {r.get('ready_s') or 0:5.1f}s  oom {r.get('oom')}  err {r.get('error')}  "
                  f"losses {losses}  opt {r.get('optimizer', r.get('mode'))}")
