"""
How far Adam's first update moves the weights at one stage, one rank, tiny model, bf16 (BENCHMARKS.md,
section 9): the mean |change| of every weight after one step, against the rate.

    python benchmarks/priming_probe.py 0 [--keep-priming]    # stage 0; stage 1 and 3 likewise
"""
import os
import sys
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from zero3bench import machine  # noqa: E402
import train_gpt as t  # noqa: E402

stage, keep = sys.argv[1], "--keep-priming" in sys.argv
if keep:  # the step DeepSpeed takes at init stays counted, as before the fix
    t.machine.forget_priming_step = lambda optimizer: None
machine.adopt_launcher_env()
args = t.options.parse_args(["--stage", stage], t.PRESETS)
config, run, tokens, _ = t.resolve(args)
device, *_ = t.init_distributed(run.timeout_s)
run, config, _ = t.compat.degrade(run, config, device)
engine = t.build_engine(t.build_model(run, config, device), run, config)
before = {n: p.detach().float().clone() for n, p in engine.module.named_parameters() if p.numel()}
x, y = t.get_batch(tokens, 0, 1, 0, run.micro_batch, 1, run.seq, device)
engine.backward(engine(x, y))
for group in engine.optimizer.param_groups:
    group["lr"] = t.learning_rate(1, run)
engine.step()
moved = [(p.detach().float() - before[n]).abs().mean().item() for n, p in engine.module.named_parameters()
         if n in before and n.endswith("weight") and p.dim() == 2]
print(f"stage {stage}{' keeping the priming step' if keep else ''}: lr {t.learning_rate(1, run):g}, mean |update| of "
      f"the matrices {sum(moved) / len(moved):.6f}, {sum(moved) / len(moved) / t.learning_rate(1, run):.3f} of lr")
os._exit(0)
