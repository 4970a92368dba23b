"""The rule: no process of this suite sees a GPU, except in the tests marked gpu (run(..., gpus=True)), so that the
CPU's defaults (the tiny model, 256 tokens of context, 2 CPU processes) hold on any machine: CUDA_VISIBLE_DEVICES
is emptied here before torch is imported, and again as every Python process the suite starts begins
(tests/no_gpus/sitecustomize.py on PYTHONPATH), since the deepspeed launcher gives its ranks GPUs 0..N-1 back.

Shared launches: each costs seconds of start-up on a CPU, so each runs once per test session (@shared), also
under pytest-xdist (the README's `-n auto --dist loadgroup`): the first worker that asks for one launches it, and
the others wait for it and read what it left. The tests marked gpu run together on one worker (tests/test_gpu.py)."""
import fcntl
import functools
import json
import os
import pickle
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest

# before anything imports torch (the rule above). A pytest-xdist worker inherits its controller's environment, in
# which this has already run: the variables as the suite was started with them travel in STARTED_WITH.
STARTED_WITH = "ZERO3_TESTS_STARTED_WITH"
_started = json.loads(os.environ.setdefault(STARTED_WITH, json.dumps(
    {name: os.environ.get(name) for name in ("CUDA_VISIBLE_DEVICES", "PYTHONPATH")})))
AS_LAUNCHED = {name: value for name, value in {**os.environ, **_started}.items() if value is not None}
NO_GPUS = Path(__file__).resolve().parent / "no_gpus"
os.environ.update(CUDA_VISIBLE_DEVICES="", PYTHONPATH=os.pathsep.join(filter(None, [str(NO_GPUS),
                                                                                     _started["PYTHONPATH"]])))
# a launch of a test marked gpu runs on one GPU, the first of those the suite was started with
ONE_GPU = {"CUDA_VISIBLE_DEVICES": (AS_LAUNCHED.get("CUDA_VISIBLE_DEVICES") or "0").split(",")[0]}


def worker_cores(worker, workers, cores):
    """The cores of pytest-xdist's worker number `worker` of `workers`: 2 of them (or all, where there are fewer),
    in turn, so that each core serves at most 2 workers where there are as many workers as cores (-n auto)."""
    cores, share = sorted(cores), min(len(cores), max(2, len(cores) // workers))
    return {cores[(worker * share + i) % len(cores)] for i in range(share)}


# torch starts a thread per core that a process may run on, in each worker and in each rank that one launches (and
# train_gpt.py shares them among its ranks): with a worker per core, 16 workers ran 16 threads each on an H100 host's
# 16 cores, and the suite took 73 CPU-minutes there (h100/5-suite) against 16 on 2 cores (cpu/ci/grouping-ab-1e400c5).
# So each worker keeps to its cores, from before torch is imported, and so does all it starts but a launch of a test
# marked gpu (run, gpus=True)
ALL_CORES = os.sched_getaffinity(0)
_worker = re.fullmatch(r"gw(\d+)", os.environ.get("PYTEST_XDIST_WORKER", ""))  # another id (--tx id=...): unpinned
if _worker:
    os.sched_setaffinity(0, worker_cores(int(_worker[1]), int(os.environ["PYTEST_XDIST_WORKER_COUNT"]), ALL_CORES))


def shared(fixture):
    """A session fixture whose value is made once per test session, also across pytest-xdist's workers: under
    xdist the first worker to ask makes it (under a lock in the workers' common folder) and pickles it there, and
    the others wait for it and read it, an exception included. The fixture takes tmp_path_factory."""
    @functools.wraps(fixture)
    def once(**fixtures):
        if "PYTEST_XDIST_WORKER" not in os.environ:
            return fixture(**fixtures)
        made = fixtures["tmp_path_factory"].getbasetemp().parent / f"shared-{fixture.__name__}.pickle"
        with open(f"{made}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not made.exists():
                made.write_bytes(pickle.dumps(outcome(fixture, fixtures)))
        value, error = pickle.loads(made.read_bytes())
        if isinstance(error, str):
            pytest.skip(error)
        if error is not None:
            raise error
        return value
    return pytest.fixture(scope="session")(once)


def outcome(fixture, fixtures):
    """(value, None) or (None, the exception it raised); a skip as its reason alone, as pytest's Skipped does not
    pickle (its class names builtins as its module)."""
    try:
        return fixture(**fixtures), None
    except pytest.skip.Exception as e:
        return None, str(e.msg)
    except BaseException as e:  # noqa: BLE001 -- every worker that asks must see the same outcome
        return None, e


PROBE = ("import torch; n = torch.cuda.device_count(); "
         "print(n, torch.cuda.get_device_properties(0).total_memory if n else 0)")


def gpus_as_launched() -> dict:
    """{"gpus": the GPUs that torch sees in the environment the suite was started in, "memory": the first one's
    bytes, "why": why none, where none}, asked of a process of its own (this one hides them). A probe that fails (a
    broken driver, a torch that does not import) is no count of 0: its "why" says so, in its last line."""
    try:
        probe = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=300,
                               env=AS_LAUNCHED)
    except subprocess.TimeoutExpired:
        return {"gpus": 0, "memory": 0, "why": "the GPU probe (torch.cuda.device_count()) did not end in 300 s"}
    said = probe.stdout.split()
    if probe.returncode != 0 or len(said) != 2 or not all(word.isdigit() for word in said):
        said = (probe.stderr.strip().splitlines() or ["no output"])[-1]
        return {"gpus": 0, "memory": 0,
                "why": f"the GPU probe (torch.cuda.device_count()) failed, exit {probe.returncode}: {said}"}
    gpus, memory = map(int, said)
    return {"gpus": gpus, "memory": memory, "why": "" if gpus else "torch sees none on this machine"}


GPUS_SEEN = "ZERO3_TESTS_GPUS"  # gpus_as_launched's answer as JSON, made once for pytest-xdist's workers
# =1: a test marked gpu fails, rather than skips, where gpus_as_launched finds none or its probe fails; for a
# machine that has GPUs and must run those tests (the GPU runs set it: benchmarks/logs/h200/)
REQUIRE_GPU = "ZERO3BENCH_REQUIRE_GPU"


def gpus_seen() -> dict:
    if GPUS_SEEN not in os.environ:
        os.environ[GPUS_SEEN] = json.dumps(gpus_as_launched())
    return json.loads(os.environ[GPUS_SEEN])


def pytest_configure(config):
    """Under pytest-xdist the GPUs are counted once, before the workers start: each inherits the count rather
    than importing torch for it (16 workers on one H200's machine)."""
    if getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput"):
        gpus_seen()


def pytest_collection_modifyitems(config, items):
    on_gpu = [item for item in items if item.get_closest_marker("gpu")]
    if not on_gpu or config.option.collectonly or os.environ.get(REQUIRE_GPU) == "1":
        return  # with REQUIRE_GPU, pytest_runtest_setup fails them instead
    seen = gpus_seen()
    if not seen["gpus"]:
        for item in on_gpu:
            item.add_marker(pytest.mark.skip(reason=f"needs a GPU, and {seen['why']}"))


def pytest_runtest_setup(item):
    if item.get_closest_marker("gpu") and os.environ.get(REQUIRE_GPU) == "1" and not gpus_seen()["gpus"]:
        pytest.fail(f"{REQUIRE_GPU}=1 requires a GPU, and {gpus_seen()['why']}", pytrace=False)


def pytest_sessionfinish(session):
    """An interrupted suite leaves no launch behind."""
    end_processes(run_processes(LAUNCH_MARKERS, "ZERO3_TEST_LAUNCH"))
    shutil.rmtree(LAUNCH_MARKERS, ignore_errors=True)


ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from zero3bench import result  # noqa: E402
from zero3bench.reporting import reading  # noqa: E402
from zero3bench.machine import free_port  # noqa: E402


LAUNCH_MARKERS = tempfile.mkdtemp(prefix="zero3-launches-")  # a folder per test session, one inside it per launch


def run(cmd, env=None, log=None, gpus=False):
    """cmd's process, its output captured; with gpus, as the user would launch it, on one GPU (ONE_GPU)."""
    # a launch that hangs fails its tests after 10 minutes, not CI's 90, and leaves none of its processes behind
    marker = tempfile.mkdtemp(prefix="launch-", dir=LAUNCH_MARKERS)
    cores_before = os.sched_getaffinity(0)  # this thread's: a process started from it inherits them
    try:
        if gpus:
            os.sched_setaffinity(0, ALL_CORES)
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600,
                              env={**({**AS_LAUNCHED, **ONE_GPU} if gpus else os.environ), "ZERO3_TEST_LAUNCH": marker,
                                   **(env or {})})
    finally:
        os.sched_setaffinity(0, cores_before)
        end_processes(run_processes(marker, "ZERO3_TEST_LAUNCH"))
    if log:
        log.write_text(proc.stdout + proc.stderr)
    return proc


def run_sh_once(tmp_path_factory, name, *args, gpus=False):
    """`bash run.sh ARGS` with its results in a fresh folder: the process, the run's folder and its runs."""
    results = tmp_path_factory.mktemp(name)
    proc = run(["bash", "run.sh", *args], env={"RESULTS": str(results)}, gpus=gpus)
    folders = list(results.iterdir())
    assert len(folders) == 1, proc.stdout + proc.stderr
    return SimpleNamespace(proc=proc, folder=folders[0], runs=json_runs(folders[0]))


# the variables a launcher sets: with them, machine.adopt_launcher_env leaves the process environment alone
LAUNCHED_AS_RANK_0 = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
                      "MASTER_PORT": "29500"}


@pytest.fixture
def check(monkeypatch, capsys):
    """check(*argv): train_gpt.main(argv + --check) in this process; its exit status and output lines."""
    for name, value in LAUNCHED_AS_RANK_0.items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(ROOT)  # for the cases' relative paths

    def run(*argv):
        argv = [str(a) for a in argv]
        if not any(a.startswith("--check") for a in argv):
            argv.append("--check")
        capsys.readouterr()
        try:
            import train_gpt  # imports DeepSpeed: only where a test checks inputs
            train_gpt.main(argv)
            status = 0
        except SystemExit as e:
            status = e.code
        out, err = capsys.readouterr()
        return SimpleNamespace(status=status, out=out.splitlines(), err=err.splitlines())
    return run


def assert_refused(result, *fragments):
    """Exit status 2, and stderr is one line, the error, holding every fragment."""
    assert result.status == 2, result
    assert "Traceback" not in "\n".join(result.err)
    [line] = result.err
    assert line.startswith("train_gpt.py: error: "), line
    for fragment in fragments:
        assert fragment in line


def facts(stage, world=4, offload=None, mem_kind="cuda"):
    """A made-up run's facts, as train_gpt.py's main() gathers them."""
    return dict(stage=stage, engine="deepspeed", rank=0, world_size=world, model="1.3b", config="c.json", dtype="bf16",
                micro_batch=2, seq=1024, lr=1e-5, warmup=2, seed=0, checkpoint=False, compile=False, max_mem_gib=None,
                timeout_s=120, offload=offload or {"optimizer": None, "param": None}, launcher="test", steps_planned=3,
                mem_kind=mem_kind, gpus=world, ranks_per_node=world)


def record(**flat):
    """A rank's result from its RESULT line's flat keys, as RankResult.from_dict reads them; a key that no field of
    the line holds fails, as a mistyped keyword would."""
    unknown = flat.keys() - result.RUN_KEYS - result.FIELDS
    assert not unknown, f"not a field of a RESULT line: {unknown}"
    return result.RankResult.from_dict(flat)


def json_results(log):
    """The RESULT lines of a log as JSON, the form in which other tools read them, by rank."""
    found = [json.loads(line.partition("RESULT ")[2]) for line in Path(log).read_text(errors="replace").splitlines()
             if "RESULT {" in line]
    return sorted(found, key=lambda r: r["rank"])


def json_runs(folder):
    """{log name: RESULT lines as JSON} for a results folder, in the report's order."""
    return {name: [json.loads(json.dumps(result.as_dict(r))) for r in results]
            for name, results in reading.load_runs(folder).items()}


def reaching_the_steps(before, after):
    """A planted edit of a figure, carried into the measurements that result.RankResult works it out from
    again: losses into the steps' losses, tokens/s into the steps' times; an edit of the steps themselves
    stands as it is."""
    if after.get("steps") != before.get("steps"):
        return after
    if after.get("losses") is not None and after["losses"] != before.get("losses"):
        steps = after["steps"]
        after["steps"] = [{**steps[min(i, len(steps) - 1)], "step": i + 1, "loss": x}
                          for i, x in enumerate(after["losses"])]
    if before.get("tokens_per_s") and after.get("tokens_per_s") != before["tokens_per_s"]:
        slower = before["tokens_per_s"] / after["tokens_per_s"]
        after["steps"] = [{**s, "time_s": s["time_s"] * slower} for s in after["steps"]]
    return after


def planted(folder, tmp_path, name, edit):
    """A copy of a results folder in which edit(result) rewrites every RESULT of the run `name`."""
    copy = Path(tempfile.mkdtemp(prefix=f"planted-{name}-", dir=tmp_path))
    shutil.copytree(folder, copy, dirs_exist_ok=True)
    log = copy / f"{name}.log"
    def rewritten(line):
        before = json.loads(line[len("RESULT "):])
        return "RESULT " + json.dumps(reaching_the_steps(before, edit(json.loads(json.dumps(before)))))
    lines = [rewritten(line) if line.startswith("RESULT ") else line for line in log.read_text().splitlines()]
    log.write_text("\n".join(lines) + "\n")
    return copy


@shared
def run_sh(tmp_path_factory):
    """`bash run.sh` end to end: on a machine without GPUs, the tiny model on 2 gloo ranks, stage 0 then 3."""
    return run_sh_once(tmp_path_factory, "results")


@pytest.fixture(scope="session")
def stage0(run_sh):
    return run_sh.runs["stage0"]


@pytest.fixture(scope="session")
def stage3(run_sh):
    return run_sh.runs["stage3"]


@shared
def stage3_torchrun_3_ranks(tmp_path_factory):
    """Stage 3 under torchrun with an odd world size, where shards need padding."""
    log = tmp_path_factory.mktemp("torchrun") / "stage3.log"
    proc = run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "3",
                "--master_port", str(free_port()), "train_gpt.py", "--stage", "3", "--model", "tiny"], log=log)
    return SimpleNamespace(proc=proc, records=json_results(log))


@shared
def single_process(tmp_path_factory):
    """Plain `python train_gpt.py`, one process and no launcher, at stage 0 and stage 3."""
    folder = tmp_path_factory.mktemp("single")
    procs = {stage: run([sys.executable, "train_gpt.py", "--stage", str(stage)], log=folder / f"stage{stage}.log")
             for stage in (0, 3)}
    return SimpleNamespace(procs=procs, folder=folder, runs=json_runs(folder))


@shared
def fp32(tmp_path_factory):
    """Both stages in fp32 on 2 ranks, where the two should follow the same trajectory to rounding."""
    folder = tmp_path_factory.mktemp("fp32")
    procs = {stage: run(["deepspeed", "--num_gpus", "2", "--master_port", str(free_port()), "train_gpt.py",
                         "--stage", str(stage), "--dtype", "fp32"], log=folder / f"stage{stage}.log")
             for stage in (0, 3)}
    return SimpleNamespace(procs=procs, folder=folder, runs=json_runs(folder))


@shared
def failing_config(tmp_path_factory):
    """A launch that DeepSpeed itself refuses once the process group has started: an optimizer that the
    input checks let through (torch.optim has it) but that ZeRO has not tested."""
    folder = tmp_path_factory.mktemp("failing")
    config = json.loads((ROOT / "ds_config_stage3.json").read_text())
    config["optimizer"] = {"type": "LBFGS", "params": {}}
    (folder / "bad.json").write_text(json.dumps(config))
    log = folder / "stage3.log"
    proc = run(["deepspeed", "--num_gpus", "2", "--master_port", str(free_port()), "train_gpt.py",
                "--config", str(folder / "bad.json")], log=log)
    return SimpleNamespace(proc=proc, records=json_results(log))


@shared
def sweep(tmp_path_factory):
    """`bash run.sh --ranks "1 2"`: both stages at two world sizes, in one results folder."""
    return run_sh_once(tmp_path_factory, "sweep", "--ranks", "1 2")


@shared
def other_stages(tmp_path_factory):
    """`bash run.sh --stages "0 1 2 3 3_offload 3_infinity" --timeline`: every stage, ZeRO-Offload and ZeRO-Infinity
    (parameters and optimizer in host memory) on 2 CPU ranks, each tracing its memory through its last step. The
    first offload run JIT-builds DeepSpeed's CPU Adam, which takes about a minute."""
    return run_sh_once(tmp_path_factory, "stages", "--stages", "0 1 2 3 3_offload 3_infinity", "--timeline")


@shared
def traced_run(tmp_path_factory):
    """`bash run.sh --timeline --peer fsdp2`: stages 0 and 3, then FSDP2, each rank tracing its memory through its
    first and last steps."""
    return run_sh_once(tmp_path_factory, "timeline", "--timeline", "--peer", "fsdp2")


@shared
def fsdp2_peer(tmp_path_factory):
    """`bash run.sh --stages 3 --peer fsdp2`: stage 3, then the same training through PyTorch's FSDP2."""
    return run_sh_once(tmp_path_factory, "peer", "--stages", "3", "--peer", "fsdp2")


@shared
def memory_cap(tmp_path_factory):
    """`bash run.sh --model small --max-mem-gib 1.75 --stages "0 3"`: a 101M-parameter model that, under the
    cap, only stage 3 can train on 2 CPU ranks (it needs 1.35-1.5 GiB, stage 0 2.0-2.1: benchmarks/logs/cpu-cap).
    run.sh's own option comes last, after train_gpt.py's. Skipped where PyTorch's CPU kernels lack AVX-512: there
    bf16 matmuls fall to its reference kernel, and one step of this model took 262 s instead of about 4 s."""
    import torch
    if "AVX512" not in torch.backends.cpu.get_cpu_capability():
        pytest.skip(f"bf16 on this CPU ({torch.backends.cpu.get_cpu_capability()}) is too slow for the 101M model")
    return run_sh_once(tmp_path_factory, "cap", "--model", "small", "--max-mem-gib", "1.75", "--stages", "0 3")


HUNG_TIMEOUT_S = 15  # train_gpt.py --timeout-s of the hung run


@shared
def hung_rank(tmp_path_factory):
    """A 2-rank stage-3 run under the deepspeed launcher whose rank 1 is stopped (SIGSTOP) once step 3 is
    logged, as if it hung. Returns the launcher's exit status (None if it never ended), the seconds from the
    stop to its end, the log with rank 0's record, and its port's shared-memory buffers as rank 1 stopped and
    after the end."""
    log = tmp_path_factory.mktemp("hung") / "stage3.log"
    port = free_port()
    ranks = []
    with open(log, "w") as out:
        launcher = subprocess.Popen(["deepspeed", "--num_gpus", "2", "--master_port", str(port), "train_gpt.py",
                                     "--stage", "3", "--steps", "400", "--timeout-s", str(HUNG_TIMEOUT_S)],
                                    cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 600
        while "step 3/" not in log.read_text(errors="replace"):
            if launcher.poll() is not None or time.monotonic() > deadline:
                pytest.fail("the run never reached step 3:\n" + log.read_text(errors="replace")[-3000:])
            time.sleep(0.2)
        ranks = psutil.Process(launcher.pid).children(recursive=True)
        [rank1] = [p for p in ranks if "--local_rank=1" in p.cmdline()]
        rank1.send_signal(signal.SIGSTOP)
        stopped = time.monotonic()
        during = list(Path("/dev/shm").glob(f"deepspeed_allreduce_buffer_{os.getuid()}_*_{port}_*"))
        try:
            status = launcher.wait(timeout=HUNG_TIMEOUT_S + 120)
        except subprocess.TimeoutExpired:
            status = None
        return SimpleNamespace(status=status, seconds=time.monotonic() - stopped, log=log,
                               records=json_results(log), buffers_during=during, buffers=list(
                                   Path("/dev/shm").glob(f"deepspeed_allreduce_buffer_{os.getuid()}_*_{port}_*")))
    finally:
        for proc in ranks:
            try:
                proc.kill()
            except psutil.NoSuchProcess:
                pass
        launcher.kill()
        launcher.wait()
        for buffer in Path("/dev/shm").glob(f"deepspeed_allreduce_buffer_{os.getuid()}_*_{port}_*"):
            buffer.unlink(missing_ok=True)


@shared
def original_design(tmp_path_factory):
    """The original design's config as it stands there (benchmarks/original_design.json) on 2 CPU ranks, with
    its fp16 section made bf16, which CPUs have: train_batch_size 8, DeepSpeed's AdamW, 5e8-element buckets.
    DeepSpeed's AdamW is its FusedAdam, which the first run builds (about 45 s)."""
    folder = tmp_path_factory.mktemp("original")
    config = json.loads((ROOT / "benchmarks" / "original_design.json").read_text())
    config["bf16"] = config.pop("fp16")
    (folder / "original.json").write_text(json.dumps(config))
    log = folder / "stage3.log"
    proc = run(["deepspeed", "--num_gpus", "2", "--master_port", str(free_port()), "train_gpt.py",
                "--config", str(folder / "original.json")], log=log)
    return SimpleNamespace(proc=proc, records=json_results(log))


@shared
def planted_faults(tmp_path_factory, run_sh):
    """Results folders that pair run_sh's healthy stage-0 log with a stage-3 run carrying one planted fault
    (tests/plant_fault.py), and, for a rate of 0, a stage-0 run with it too, so that the two stages agree. The runs
    that keep weights gathered trace their memory too (--timeline), for the timeline to name what stays gathered."""
    folders = {}
    for fault, stages in {"lr0": (0, 3), "zero_grads": (3,), "perturb_shard": (3,), "keep_block": (3,),
                          "keep_gathered": (3,)}.items():
        folder = tmp_path_factory.mktemp(fault)
        for stage in (0, 3):
            log = folder / f"stage{stage}.log"
            if stage in stages:
                run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                     str(free_port()), "tests/plant_fault.py", fault, "--stage", str(stage),
                     *(["--timeline"] if fault.startswith("keep_") else [])], log=log)
            else:
                shutil.copy(run_sh.folder / log.name, log)
        folders[fault] = folder
    return folders


def run_processes(results, variable="ZERO3_BENCH_RUN"):
    """The processes still alive that a run.sh with its results under `results` started (ZERO3_BENCH_RUN), or
    that a test's launch started (ZERO3_TEST_LAUNCH)."""
    alive = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get(variable, "").startswith(str(results)):
                alive.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return alive


def end_processes(procs):
    """SIGKILL to each of procs (psutil's), passing over one that ended since it was found: under load, a launch's
    last processes may end between the two."""
    for proc in procs:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass


def default_signals():
    """As at a terminal: a test run in the background inherits SIGINT ignored, which run.sh could then not trap."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def run_sh_signalled(tmp_path_factory, name, act, *args):
    """`bash run.sh --steps 3000 ARGS` in a session of its own, and act(run_sh's Popen, results) once its rank 0
    has logged step 5; then the exit status, the seconds from act to the end of the run's processes (its launcher
    and ranks) and to run.sh's end (its report written), the output, the folder, the run's processes still alive just
    after, and the shared-memory buffers of its port, just before act (as the
    run holds them: the glob's positive control) and after."""
    from zero3bench.launches import CPU_PROCESSES  # run.sh's ranks on a machine without GPUs
    results = tmp_path_factory.mktemp(name)
    out = results / "out.txt"
    with open(out, "w") as sink:
        # LOCAL_SIZE as the deepspeed launcher sets it: DeepSpeed maps its CPU all-reduce's /dev/shm buffers only
        # where LOCAL_SIZE is the world size (shm_interface.cpp), and run.sh's torchrun sets none, so that without
        # it there would be no buffer for the run to leave
        proc = subprocess.Popen(["bash", "run.sh", "--steps", "3000", *args], cwd=ROOT, stdout=sink,
                                stderr=subprocess.STDOUT,
                                env={**os.environ, "RESULTS": str(results), "LOCAL_SIZE": str(CPU_PROCESSES)},
                                start_new_session=True, preexec_fn=default_signals)
    try:
        deadline = time.monotonic() + 600
        while "step 5/3000" not in out.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, out.read_text()[-3000:]
            time.sleep(0.2)
        [running] = [p for p in results.iterdir() if p.is_dir()]
        during = shared_memory_of(running)
        acted = time.monotonic()
        act(proc, results)
        ended = seconds_until_ended(results, acted, 120)
        status = proc.wait(timeout=120)
        seconds = time.monotonic() - acted
        alive = run_processes(results)
    finally:
        proc.kill()
        end_processes(run_processes(results))
    [folder] = [p for p in results.iterdir() if p.is_dir()]
    left = shared_memory_of(folder)
    for buffer in left:  # counted, then gone, so that a run that left them does not leave them on the machine
        buffer.unlink(missing_ok=True)
    return SimpleNamespace(status=status, ended=ended, seconds=seconds, out=out.read_text(), folder=folder, alive=alive,
                           buffers_during=during, buffers=left)


def seconds_until_ended(results, since, limit):
    """The seconds from since until none of the run's processes is left, waiting at most limit of them."""
    while run_processes(results) and time.monotonic() < since + limit:
        time.sleep(0.1)
    return time.monotonic() - since


def shared_memory_of(folder):
    """DeepSpeed's CPU all-reduce buffers in /dev/shm of the runs of a results folder, found by their ports: one
    per rank, deepspeed_allreduce_buffer_{uid}_{master address}_{port}_{rank} (its shm.cpp)."""
    ports = {re.search(r"--master_port[ =](\d+)", reading.read_command(log))[1] for log in folder.glob("*.log")}
    return sorted(p for port in ports for p in Path("/dev/shm").glob(f"deepspeed_allreduce_buffer_*_{port}_*"))


@shared
def ctrl_c(tmp_path_factory):
    """Ctrl-C at a terminal: SIGINT to run.sh's whole process group, during stage 0 of stages 0 and 3."""
    return run_sh_signalled(tmp_path_factory, "ctrl_c", lambda proc, _: os.killpg(proc.pid, signal.SIGINT))


@shared
def sigterm(tmp_path_factory):
    """A scheduler's SIGTERM to run.sh alone, during stage 3."""
    return run_sh_signalled(tmp_path_factory, "sigterm", lambda proc, _: proc.terminate(), "--stages", "3")


def is_rank(proc, variable, rank):
    try:
        return "train_gpt.py" in " ".join(proc.cmdline()) and proc.environ().get(variable) == rank
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def rank_1(procs, variable):
    """The one rank-1 process among procs. A child that rank 1 forks has its command line and variables until it
    execs, so the rank is the match whose parent is none."""
    ranks = [p for p in procs if is_rank(p, variable, "1")]
    [rank1] = [p for p in ranks if p.ppid() not in {r.pid for r in ranks}]
    return rank1


def kill_rank_1(proc, results):
    rank_1(run_processes(results), "RANK").kill()


@shared
def rank_killed(tmp_path_factory):
    """SIGKILL to rank 1 during stage 3."""
    return run_sh_signalled(tmp_path_factory, "killed", kill_rank_1, "--stages", "3")


@pytest.fixture
def tmpfs(tmp_path):
    """tmpfs(size_bytes): a fresh file system of that size under tmp_path, to fill (skipped where mount is refused)."""
    mounts = []

    def mount(size, options=""):
        folder = tmp_path / f"fs{len(mounts)}"
        folder.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}{options}", "tmpfs", str(folder)],
                              capture_output=True, text=True)
        if done.returncode:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
        mounts.append(folder)
        return folder
    yield mount
    for folder in mounts:
        subprocess.run(["umount", "-l", str(folder)])


def squat(folder, held):
    """Takes the port of stage 0 of a results folder under `folder` as soon as stage 0, once its process group
    has started, lets it go, and listens on it until the folder's report.txt is written; held['port'] says it
    did before stage 3 launched."""
    deadline = time.monotonic() + 600
    while not list(folder.glob("*/stage0.log")) and time.monotonic() < deadline:
        time.sleep(0.05)
    log = next(folder.glob("*/stage0.log"))
    while not re.search("process group: done|ENDED", log.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    port = int(re.search(r"(?:MASTER_PORT=|--master_port )(\d+)", log.read_text())[1])
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # past the run's connections in TIME_WAIT
        while time.monotonic() < deadline:
            try:
                s.bind(("", port))
                break
            except OSError:
                time.sleep(0.02)
        s.listen()
        held["port"] = port if not (log.parent / "stage3.log").exists() else None
        while not (log.parent / "report.txt").exists() and time.monotonic() < deadline:
            time.sleep(0.2)


@shared
def pipe_and_caller(tmp_path_factory):
    """`bash run.sh --ranks 1 | head -n 4` as a PyTorchJob pod's shell would run it: RANK=1 WORLD_SIZE=2 and a
    master inherited, and a listener that takes stage 0's port as soon as stage 0 ends."""
    results = tmp_path_factory.mktemp("pipe")
    held = {}
    squatter = threading.Thread(target=squat, args=(results, held), daemon=True)
    squatter.start()
    proc = run(["bash", "-c", 'bash run.sh --ranks 1 | head -n 4; exit "${PIPESTATUS[0]}"'],
               env={"RESULTS": str(results), "RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                    "MASTER_PORT": str(free_port())})
    squatter.join(timeout=5)
    [folder] = [p for p in results.iterdir() if p.is_dir()]
    return SimpleNamespace(proc=proc, folder=folder, runs=json_runs(folder), squatted=held.get("port"))


def killed_group(seconds):
    """SIGKILL to run.sh's process group, then the seconds until none of the run's processes is left (at most 30),
    and the wait for run.sh's watchdog (its command line names the run's folder) to end, its clean-up done."""
    def act(proc, results):
        os.killpg(proc.pid, signal.SIGKILL)
        killed = time.monotonic()
        seconds.append(seconds_until_ended(results, killed, 30))
        while naming(results) and time.monotonic() < killed + 30:
            time.sleep(0.1)
    return act


def naming(folder):
    """The processes whose command line names folder."""
    named = []
    for proc in psutil.process_iter():
        try:
            if str(folder) in " ".join(proc.cmdline()):
                named.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return named


@shared
def group_killed(tmp_path_factory):
    """`kill -KILL -<pgid>` of run.sh during stage 3, which no trap can see."""
    seconds = []
    run = run_sh_signalled(tmp_path_factory, "group_killed", killed_group(seconds), "--stages", "3")
    run.seconds = seconds[0]
    return run
