"""
What train_gpt.py needs from the machine and the launcher, and the workarounds for them, each with why,
so that each can go when its cause does.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import re
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Mapping, MutableMapping
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import deepspeed
import torch
from deepspeed.runtime.base_optimizer import ZeROOptimizer

from zero3bench import compat, launchers
from zero3bench.parts import Environment
from zero3bench.options import MAX_RANKS, BadInput

if TYPE_CHECKING:
    from deepspeed.runtime.engine import DeepSpeedEngine

    from zero3bench import fsdp2

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter


def free_port() -> int:
    """A port that nothing holds on any interface now (run.sh's free_port is the same, without torch)."""
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def adopt_launcher_env(env: MutableMapping[str, str] = os.environ) -> str:
    """The launcher's name (launchers.LAUNCHERS), with RANK and the rest of torch.distributed's variables set in
    env. The deepspeed launcher and torchrun set them; srun and mpirun set their own instead: without these, every
    process would train alone as rank 0 of 1. A launcher that sets neither is refused rather than guessed."""
    found = next((launcher for launcher in launchers.LAUNCHERS if launcher.started(env)), None)
    if "RANK" in env:  # set by its launcher, or by hand: left as it is
        return found.name if found else launchers.UNNAMED
    if found:
        env.update(found.torch_variables(env))
        return found.name
    if any(name in env for name in launchers.UNREAD):
        raise BadInput("this MPI sets PMI_RANK, which train_gpt.py does not read: set RANK, LOCAL_RANK, WORLD_SIZE, "
                       "MASTER_ADDR and MASTER_PORT, or launch with one of "
                       f"{', '.join(launcher.name for launcher in launchers.LAUNCHERS)}")
    env.update({"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"})
    env.setdefault("MASTER_PORT", str(free_port()))
    return launchers.ONE_PROCESS


def checked_launcher_env(env: MutableMapping[str, str] = os.environ) -> str:
    """adopt_launcher_env, then the variables it leaves checked as one set: a set inherited in part (a PyTorchJob
    pod, a Slurm allocation) or mistyped stops here in one line, not later in a KeyError or a hung rendezvous."""
    given = {name: env.get(name) for name in ("WORLD_SIZE", "LOCAL_RANK")}
    launcher = adopt_launcher_env(env)
    overruled = [f"{name}={value}" for name, value in given.items() if value not in (None, env.get(name))]
    if launcher == launchers.ONE_PROCESS and overruled:
        raise BadInput(f"{' '.join(overruled)} is set but not RANK, so this process would train alone: set RANK and "
                       "the rest, or unset them")
    missing = [name for name in launchers.TORCH_VARIABLES if not env.get(name)]
    if missing:
        raise BadInput(f"RANK={env['RANK']} is set but not {', '.join(missing)}: a launcher sets all of "
                       f"{', '.join(launchers.TORCH_VARIABLES)}; set the rest, or unset RANK to train as one process")
    numbers = {name: env[name] for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_PORT")
               if name in env}
    for name, text in numbers.items():
        if not text.isdecimal():
            raise BadInput(f"{name}={text!r} must be a whole number, 0 or more")
    n = {name: int(text) for name, text in numbers.items()}
    wrong = next((why for fault, why in [
        (not 1 <= n["WORLD_SIZE"] <= MAX_RANKS, f"WORLD_SIZE runs from 1 to {MAX_RANKS:,}"),
        (n["RANK"] >= n["WORLD_SIZE"], "RANK runs from 0 to WORLD_SIZE - 1"),
        (n["LOCAL_RANK"] >= n["WORLD_SIZE"], "LOCAL_RANK runs from 0 to WORLD_SIZE - 1"),
        (not 1 <= n.get("LOCAL_WORLD_SIZE", 1) <= n["WORLD_SIZE"], "LOCAL_WORLD_SIZE runs from 1 to WORLD_SIZE"),
        (not 1 <= n["MASTER_PORT"] <= 65535, "MASTER_PORT runs from 1 to 65535")] if fault), None)
    if wrong:
        given = " ".join(f"{name}={text}" for name, text in numbers.items())
        raise BadInput(f"the launcher's variables do not agree ({given}): {wrong}")
    return launcher


def local_ranks(world: int, env: Mapping[str, str] = os.environ) -> int:
    """The ranks on this host: the launcher's count (torchrun's LOCAL_WORLD_SIZE, Open MPI's LOCAL_SIZE), else all."""
    return int(env.get("LOCAL_WORLD_SIZE") or env.get("LOCAL_SIZE") or world)


def launcher_node(launcher: str, env: Mapping[str, str] = os.environ) -> str:
    """The node this rank runs on, by its launcher's name for it (srun's, the deepspeed launcher's hostfile's),
    else the host's name."""
    found = launchers.named(launcher)
    return (found and found.node and found.node(env)) or socket.gethostname()


def prepare_process(launcher: str) -> None:
    """What a training process needs before DeepSpeed starts its work, each with its reason."""
    found = launchers.named(launcher)
    if found and found.one_stream:
        one_output_stream()
    normalise_cuda_arch_list()
    fall_back_caches()
    keep_extensions_apart()
    ask_the_cpu_once()
    # DeepSpeed (0.14 to 0.19.8 at least) calls torch.distributed functions that torch 2.4 on deprecates: the
    # warnings say nothing that a user can act on
    warnings.filterwarnings("ignore", message=r".*torch\.distributed\.\w+.* is deprecated")


def use_gpu(index: int) -> torch.device:
    """Put this process on GPU index. DeepSpeed's zero.Init and engine place their tensors on LOCAL_RANK, not
    on the current device: with more ranks than GPUs (a rehearsal) LOCAL_RANK must name the GPU, not the rank."""
    device = torch.device("cuda", index)
    torch.cuda.set_device(device)
    os.environ["LOCAL_RANK"] = str(index)
    return device


def forget_priming_step(optimizer: torch.optim.Optimizer) -> None:
    """Without ZeRO (stage 0), DeepSpeed's 16-bit optimizers create Adam's state with one step on zero
    gradients, which Adam counts: the first real update took a second step's bias correction (0.73 of its
    size), unlike stages 1 to 3 (DeepSpeed 0.19.8 still primes). Built at rate 0, that step moved no weight;
    its state is dropped so that Adam starts afresh."""
    optimizer.state.clear()
    for group in optimizer.param_groups:
        group.pop("step", None)  # DeepSpeed's FusedAdam counts per group


# The newest DeepSpeed in which engine.backward was read to leave a 16-bit optimizer's fp16 loss unscaled without
# ZeRO (0.19.3 and 0.19.8 alike); a later one may scale it itself (DeepSpeed PR #8393), which this must not repeat.
UNSCALED_FP16_BACKWARD_UNTIL = (0, 19, 8)


def leaves_fp16_loss_unscaled(version: str) -> bool:
    """Whether a DeepSpeed of this version is one of those read to leave the loss unscaled."""
    return tuple(int(part) for part in re.findall(r"\d+", version)[:3]) <= UNSCALED_FP16_BACKWARD_UNTIL


FP16_BACKWARD_UNSCALED = leaves_fp16_loss_unscaled(deepspeed.__version__)  # the installed one's, asked once


def loss_scale(engine: DeepSpeedEngine | fsdp2.Engine) -> float | None:
    """fp16's loss scale now: ZeRO's optimizers keep it as cur_scale, the 16-bit ones without ZeRO in
    loss_scale_config (DeepSpeed 0.19.3 to 0.19.8)."""
    holder = getattr(engine.optimizer, "loss_scale_config", engine.optimizer)
    return getattr(holder, "cur_scale", None)


def unscaled_fp16_backward(engine: DeepSpeedEngine | fsdp2.Engine) -> str:
    """Why this run scales its fp16 loss before engine.backward, as one clause; "" where it need not. Without
    ZeRO, DeepSpeed's engine.backward multiplies an fp16 loss by the loss scale only for ZeRO's optimizers, yet
    stage 0's FP16 optimizers divide the gradients by it at the step: its gradients came out 1/loss-scale of their
    size and were never clipped (on an H200, stage 0 then trailed stage 3 by 3% at step 3; on CPU ranks the norm
    that it clipped with was the true norm over the loss scale)."""
    fp16 = getattr(engine, "fp16_enabled", lambda: False)()  # FSDP2's engine trains bf16 or fp32 only
    if FP16_BACKWARD_UNSCALED and fp16 and not isinstance(engine.optimizer, ZeROOptimizer):
        return (", the fp16 loss scaled before engine.backward, which leaves it unscaled without ZeRO "
                "(DeepSpeed PR #8393)")
    return ""


def loss_for_backward(engine: DeepSpeedEngine | fsdp2.Engine, loss: torch.Tensor) -> torch.Tensor:
    """The loss as engine.backward must receive it for the step to see gradients of their true size."""
    return loss * loss_scale(engine) if unscaled_fp16_backward(engine) else loss


def leave(world: int, status: int) -> NoReturn:
    """End the process with status, without the interpreter's teardown: after ZeRO-3 on gloo (seen with DeepSpeed
    0.19.8 and torch 2.14.1) it sometimes aborts ("terminate called without an active exception") after all the work
    is done. A failed rank's peers may be blocked in a collective; the launcher ends them when it sees the
    failure's exit status."""
    release_shared_memory(world)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def one_output_stream() -> None:
    """Open MPI's mpirun (4.1) forwards a rank's stdout and stderr apart and writes them out in chunks, not
    lines: a traceback on stderr split rank 0's RESULT line in two, which no report could read. Its stderr goes
    into its stdout, one stream, in order."""
    sys.stderr.flush()
    os.dup2(sys.stdout.fileno(), sys.stderr.fileno())


def normalise_cuda_arch_list() -> None:
    """DeepSpeed's JIT op builder reads TORCH_CUDA_ARCH_LIST as numbers and fails on suffixed entries such
    as Hopper's '9.0a' (images set it so); its ops need no arch-specific instructions, so build for '9.0'."""
    archs = os.environ.get("TORCH_CUDA_ARCH_LIST")
    if archs:
        os.environ["TORCH_CUDA_ARCH_LIST"] = re.sub(r"(\d+\.\d+)[a-z]+", r"\1", archs)


def extensions_folder() -> Path:
    """DeepSpeed JIT-builds its C++ ops (the CPU all-reduce, CPU Adam) into ~/.cache/torch_extensions, one
    folder for every Python environment: two environments with different torch builds rebuilt each other's
    ops there, about 100 s a stage on 2 cores. Each environment gets its own folder, named after its prefix
    and torch."""
    key = hashlib.sha1(f"{sys.prefix} {torch.__version__}".encode()).hexdigest()[:8]
    return Path.home() / ".cache" / "torch_extensions" / f"{Path(sys.prefix).name}-torch{torch.__version__}-{key}"


def ask_the_cpu_once() -> None:
    """py-cpuinfo (9.0) starts a Python subprocess for each get_cpu_info(), 0.7 to 1.2 s on 2 busy cores, and
    DeepSpeed (0.19.8) asks it three times for each op it loads and once more for each CPU Adam it makes: 8 times in
    a CPU rank that loads its all-reduce and CPU Adam. A process's CPU does not change: the first answer serves."""
    try:
        import cpuinfo
    except ImportError:  # DeepSpeed then asks lscpu, once per question
        return
    if not hasattr(cpuinfo.get_cpu_info, "cache_info"):
        cpuinfo.get_cpu_info = functools.cache(cpuinfo.get_cpu_info)


def keep_extensions_apart() -> None:
    """The ops of this environment in a folder of their own (extensions_folder); a TORCH_EXTENSIONS_DIR that
    is set already is kept."""
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(extensions_folder()))


def home_caches() -> dict[str, Path]:
    """What a run writes under the home folder, by the variable that moves it: the ops (extensions_folder),
    Triton's kernels (torch.compile and DeepCompile on GPUs) and matplotlib's font list (report.py)."""
    home = Path.home()
    return {"TORCH_EXTENSIONS_DIR": extensions_folder(), "TRITON_CACHE_DIR": home / ".triton" / "cache",
            "MPLCONFIGDIR": home / ".cache" / "matplotlib"}


def writable(folder: Path) -> bool:
    """Whether a file can be made in folder or, while it is missing, in the folder that would make it: not
    under a read-only home, as some containers mount it (the ops' build, which takes a lock file there, would
    fail even with the ops built). Nothing is left behind."""
    existing = next(p for p in (folder, *folder.parents) if p.exists())
    try:
        with tempfile.TemporaryFile(dir=existing):
            return True
    except OSError:
        return False


def fall_back_caches(env: MutableMapping[str, str] = os.environ) -> dict[str, Path]:
    """Each cache of home_caches that no variable places and that cannot be written, moved to a folder of the
    temp dir, with what it holds (the ops already built, which then need no rebuild); returns {variable:
    the folder it could not write}."""
    moved = {}
    for variable, folder in home_caches().items():
        if variable in env or writable(folder):
            continue
        instead = Path(tempfile.gettempdir(), f"zero3-bench-{os.getuid()}", folder.relative_to(Path.home()))
        if folder.is_dir() and not instead.exists():
            shutil.copytree(folder, instead, symlinks=True)
        env[variable], moved[variable] = str(instead), folder
    return moved


def release_shared_memory(world: int) -> None:
    """DeepSpeed's CPU all-reduce maps a 66 MB buffer per rank from /dev/shm, named after the master's
    address and port, and never unlinks it: each run on CPUs would leave its buffers behind until the
    host's memory runs out. Every rank unlinks every rank's on its way out, so that a peer that died leaves
    none (a mapped buffer stays until its last process exits); run.sh removes what a killed run left."""
    prefix = f"deepspeed_allreduce_buffer_{os.getuid()}_{os.environ.get('MASTER_ADDR')}_{os.environ.get('MASTER_PORT')}"
    for rank in range(world):
        Path("/dev/shm", f"{prefix}_{rank}").unlink(missing_ok=True)


def cap_memory(device: torch.device, gib: float) -> None:
    """--max-mem-gib makes an out-of-memory reproducible on any machine. On a GPU it caps PyTorch's caching
    allocator (its per-process memory fraction). On a CPU it caps the process's data segment (RLIMIT_DATA)
    at what it holds now plus the cap, so that the Python runtime and DeepSpeed do not count."""
    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, gib * 2**30 / total), device)
        return
    torch.ones(1 << 22).sum()  # start torch's thread pool now: its threads' stacks count as data too
    # glibc keeps freed blocks below a moving threshold in its heap; a fixed threshold hands every block
    # over 64 KiB back when freed, so the data segment follows the live tensors
    ctypes.CDLL(None).mallopt(M_MMAP_THRESHOLD, 64 * 1024)
    data_kib = int(re.search(r"VmData:\s+(\d+) kB", Path("/proc/self/status").read_text()).group(1))
    resource.setrlimit(resource.RLIMIT_DATA, (data_kib * 1024 + int(gib * 2**30), resource.RLIM_INFINITY))


def out_of_memory(e: BaseException) -> bool:
    """A GPU's out-of-memory (from PyTorch's allocator, or a CUDA call such as a pinned host buffer's), or a
    CPU allocation refused (as under --max-mem-gib)."""
    text = str(e)
    return (isinstance(e, (compat.OutOfMemoryError, MemoryError)) or "out of memory" in text.lower()
            or "DefaultCPUAllocator: can't allocate memory" in text)


def silent_ranks(watch: torch.distributed.ProcessGroup) -> str:
    """Which ranks no longer answer, asked in the gloo group `watch` of every rank that is still alive."""
    try:
        torch.distributed.monitored_barrier(group=watch, timeout=timedelta(seconds=10), wait_all_ranks=True)
    except RuntimeError as e:
        return " ".join(str(e).split())[:300]
    return "every rank still answers"


# Dense bf16 peak TFLOP/s by device name, for MFU; the first key found as a whole word wins, so the
# specific names come first.
PEAK_TFLOPS = {
    "H100 PCIe": 756, "H100 NVL": 835, "H200 NVL": 835, "H100": 989, "H200": 989, "H800": 989,
    "GB200": 2500, "B200": 2250, "A100": 312, "A800": 312, "L40S": 362, "L40": 181, "A10G": 70, "A10": 125,
    "L4": 121, "MI300X": 1307, "MI250X": 383,
}


def by_gpu_name(table: Mapping[str, int | None], device: torch.device) -> int | None:
    """The first entry of table whose key is a word of the GPU's name: put "H100 PCIe" before "H100"."""
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in table.items() if re.search(rf"\b{re.escape(k)}\b", name)), None)


# NVLink's bandwidth per GPU and direction, GB/s, within one node: the ceiling of nccl-tests' bus bandwidth
NVLINK_GBPS = {"H100 PCIe": None, "H100 NVL": None, "H200 NVL": None, "H100": 450, "H200": 450, "H800": 200,
               "A100": 300, "A800": 200, "B200": 900, "GB200": 900}


def link_bandwidth(device: torch.device, world: int, rehearsal: bool, ranks_per_node: int) -> float | None:
    """The link between this node's GPUs in bytes per second, where NCCL runs over it alone: one node, one
    rank per GPU, a known GPU."""
    if device.type != "cuda" or rehearsal or world > ranks_per_node or world < 2:
        return None
    gbps = by_gpu_name(NVLINK_GBPS, device)
    return gbps and gbps * 1e9


def peak_tflops(device: torch.device, dtype: str) -> int | None:
    """The device's dense 16-bit peak; none for a CPU, an unknown device, or fp32, which runs slower."""
    if device.type != "cuda" or dtype == "fp32":
        return None
    return by_gpu_name(PEAK_TFLOPS, device)


def environment(device: torch.device) -> Environment:
    """What the run ran on, for each rank's result."""
    env = {"host": socket.gethostname(), "python": platform.python_version(), "torch": torch.__version__,
           "deepspeed": deepspeed.__version__, "cuda": torch.version.cuda, "gpus_on_host": torch.cuda.device_count(),
           "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"}
    if device.type == "cuda":
        try:
            env["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                           capture_output=True, text=True, timeout=30).stdout.split()[0]
        except (OSError, IndexError, subprocess.SubprocessError):
            env["driver"] = None
    return Environment.from_dict(env)
