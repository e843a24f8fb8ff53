"""gpulab.parallel.dist: launch runs real gloo ranks, and every way a rank can fail ends the run quickly,
names the rank, and leaves no process behind.

The workers below run in ranks forked from launch's fork server, which import this module by
name (pytest puts tests/ on sys.path, and multiprocessing hands sys.path to its children), so
they must stay at top level. The server's start costs about 7 CPU-s once (torch, its compiler
front end, FSDP); each later run of 2 ranks well under a second.
"""
import gc
import multiprocessing
import multiprocessing.forkserver
import os
import re
import signal
import sys
import threading
import time
import types

import pytest
import torch
import torch.distributed as dist

from gpulab.parallel.dist import LaunchError, default_backend, free_port, launch, worker_device
import gpulab.parallel.dist


# ----------------------------------------------------------------------------- workers

def sum_ranks(rank, world_size, scale):
    """all_reduce of the rank numbers: every rank ends with 0 + 1 + ... + (world_size - 1)."""
    cpu_before_worker = time.process_time()   # a forked rank's clock starts at 0
    device = worker_device(rank)
    t = torch.tensor([float(rank)], device=device)
    dist.all_reduce(t)
    return {"rank": rank, "sum": t.item(), "tensor": scale * torch.arange(300_000.0) + rank,
            "backend": dist.get_backend(), "device": str(device),
            "threads": torch.get_num_threads(), "cpu_before_worker": cpu_before_worker,
            "probe": os.environ.get("GPULAB_LAUNCH_PROBE"), "bad_fork": torch.cuda._is_in_bad_fork(),
            "env": (os.environ["RANK"], os.environ["WORLD_SIZE"], os.environ["MASTER_PORT"])}


def fail_on_rank_1(rank, world_size, how, pid_dir):
    """Rank 1 fails ``how`` while rank 0 waits in an all_reduce that rank 1 never joins (with
    "hang_alone", rank 0 returns at once instead). Each rank first records its pid."""
    pid_file = os.path.join(pid_dir, f"rank{rank}.pid")
    with open(pid_file + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.replace(pid_file + ".tmp", pid_file)  # whole or absent, even if killed right here
    if rank == 0 and how == "hang_alone":
        return rank
    if rank == 1:
        if how == "raise":
            raise ValueError("rank 1 refuses")
        if how == "exit":
            os._exit(3)  # no traceback, no reply, no cleanup
        if how == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        if how in ("hang", "hang_alone"):
            time.sleep(3600)
    dist.all_reduce(torch.ones(1))
    return rank


def sharded_state_on_a_one_gpu_host(rank, world_size):
    """Chapter 06's ZeRO/FSDP worker as it runs on a host with CUDA and ONE GPU, where two
    ranks use gloo on the CPU: torch is told CUDA exists with one device (its accelerator is
    CUDA), and, as on such a host, making GPU 1 current fails. The worker must keep to the CPU."""
    asked = []

    def set_device(device):
        asked.append(str(device))
        index = device if isinstance(device, int) else torch.device(device).index
        if index is not None and index >= 1:
            raise RuntimeError("CUDA error: invalid device ordinal")

    torch.cuda.is_available = lambda: True
    torch.cuda.device_count = lambda: 1
    torch.cuda.set_device = set_device
    torch._C._get_accelerator = lambda: torch.device("cuda")
    from gpulab.parallel import data_parallel  # here, not at the top: every test's ranks import this file
    return data_parallel.sharded_state(rank, world_size), asked


# ----------------------------------------------------------------------------- helpers

def assert_all_gone(pid_dir=None):
    """No rank outlives launch: multiprocessing knows no live child, and the pids the workers
    wrote no longer exist (launch reaped them, so not even as zombies)."""
    assert multiprocessing.active_children() == []
    pids = [int(p.read_text()) for p in pid_dir.glob("*.pid")] if pid_dir else []
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    return pids


def failing_launch(how, tmp_path, **kwargs):
    """The LaunchError's message, the seconds launch took, and the seconds from rank 1's failure
    (it wrote its pid file just before) to launch's return: the first includes starting the
    processes, which a loaded machine slows, the second is launch's own reaction time."""
    start = time.monotonic()
    with pytest.raises(LaunchError) as info:
        launch(fail_on_rank_1, 2, args=(how, str(tmp_path)), **kwargs)
    pid_file = tmp_path / "rank1.pid"  # absent if rank 1 never got that far
    reaction = time.time() - pid_file.stat().st_mtime if pid_file.exists() else None
    return str(info.value), time.monotonic() - start, reaction


# ----------------------------------------------------------------------------- tests

def test_two_concurrent_launches_of_two_gloo_ranks(monkeypatch):
    """The basic promise, twice at once: each rank runs, all_reduce sums across the ranks, results
    come back ordered by rank, tensors intact, with the torchrun-style environment set. The two
    launches run from threads (as two notebooks or parallel tests would) and do not collide,
    because each picks its own free port rather than a fixed 29500. The ranks are forked from
    the fork server, torch already imported (they start with next to no CPU spent; a spawned
    rank spends 3-4 s importing torch), and get the caller's environment of now, not the
    server's from when it started."""
    multiprocessing.get_context("forkserver").set_forkserver_preload(list(gpulab.parallel.dist.PRELOAD))
    multiprocessing.forkserver.ensure_running()  # started before the variable below is set
    monkeypatch.setenv("GPULAB_LAUNCH_PROBE", str(time.time()))
    ports = {free_port() for _ in range(5)}
    assert len(ports) >= 4 and all(1024 < p < 65536 for p in ports)
    out = {}

    def run(scale):
        try:
            out[scale] = launch(sum_ranks, 2, (scale,))
        except Exception as e:  # shown by the assert below
            out[scale] = e

    threads = [threading.Thread(target=run, args=(scale,)) for scale in (1.0, 10.0)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(out) == 2 and all(isinstance(results, list) for results in out.values()), out
    for scale, results in out.items():
        assert [r["rank"] for r in results] == [0, 1]
        assert [r["sum"] for r in results] == [1.0, 1.0]
        for rank, r in enumerate(results):
            # 1.2 MB each: more than a pipe holds, so launch must read while the rank writes
            assert torch.equal(r["tensor"], scale * torch.arange(300_000.0) + rank)
            assert (r["backend"], r["device"]) == ("gloo", "cpu")
            assert r["env"][:2] == (str(rank), "2")
            assert r["threads"] == int(os.environ.get("OMP_NUM_THREADS", 1))  # 2 cores, 2 ranks
            assert r["probe"] == os.environ["GPULAB_LAUNCH_PROBE"]
            # torch imported, not CUDA started, in the server (False on a CPU-only torch anyway)
            assert r["cpu_before_worker"] < 1.5 and r["bad_fork"] is False
        assert results[0]["env"][2] == results[1]["env"][2]  # the ranks met on one port...
    assert out[1.0][0]["env"][2] != out[10.0][0]["env"][2]  # ...each launch on its own
    assert_all_gone()


def test_a_raising_rank_is_named_with_its_traceback(tmp_path):
    """The worker's own traceback comes back in the error, first, though rank 0 fails too (its
    all_reduce loses its peer) and is reported after it, or stopped."""
    message, elapsed, reaction = failing_launch("raise", tmp_path)
    assert message.startswith("launch failed: rank 1: ValueError: rank 1 refuses")
    assert "--- rank 1 traceback ---" in message and 'raise ValueError("rank 1 refuses")' in message
    assert "then rank 0: " in message or "launch stopped rank(s) 0" in message
    # Long before the 30 s collective timeout; process start-up (in elapsed) is the machine's.
    assert reaction < 20 and elapsed < 30 + 30
    assert len(assert_all_gone(tmp_path)) == 2


@pytest.mark.parametrize("how, cause", [("exit", "exit code 3"),
                                        ("sigkill", "killed by signal 9 (SIGKILL)")])
def test_a_rank_that_dies_is_noticed_at_once(tmp_path, how, cause):
    """A rank that vanishes sends no traceback; launch sees its exit and stops rank 0, which is
    blocked waiting for it, long before the 30 s collective timeout."""
    message, elapsed, reaction = failing_launch(how, tmp_path)
    assert message.startswith(f"launch failed: rank 1: the process died without reporting a "
                              f"result ({cause})")
    assert reaction < 20 and elapsed < 30 + 30    # before the collective timeout, as above
    assert len(assert_all_gone(tmp_path)) == 2


def test_a_hung_run_times_out_and_says_who_hung(tmp_path):
    """Rank 1 sleeps forever: after ``timeout`` seconds launch gives up, says which ranks had not
    finished, and kills them. (Whether rank 0 finished in time depends on how fast the machine
    starts processes, about 3-5 s here, so the message may list rank 0 as unfinished too.)"""
    message, elapsed, _ = failing_launch("hang_alone", tmp_path, timeout=3)
    assert message.startswith("launch timed out after") and "(timeout=3 s)" in message
    assert re.search(r"rank\(s\) (0, )?1 had not finished \(finished: (0|none)\)", message)
    assert 3 <= elapsed < 3 + 20                   # the deadline, then killing and reaping
    assert_all_gone(tmp_path)


def test_an_interrupted_launch_leaves_no_rank_behind(tmp_path, monkeypatch):
    """Interrupting the kernel raises KeyboardInterrupt inside launch, here injected while it polls
    two running ranks (rank 0 blocked in all_reduce, rank 1 asleep): both must still be stopped."""
    collect = gpulab.parallel.dist._collect

    def interrupted_once_both_run(pipe, proc):
        if len(list(tmp_path.glob("*.pid"))) == 2:
            raise KeyboardInterrupt
        return collect(pipe, proc)

    monkeypatch.setattr(gpulab.parallel.dist, "_collect", interrupted_once_both_run)
    with pytest.raises(KeyboardInterrupt):
        # the timeout only bounds a broken run: process start-up on a loaded machine takes 20 s
        launch(fail_on_rank_1, 2, args=("hang", str(tmp_path)), timeout=120)
    assert len(assert_all_gone(tmp_path)) == 2


def test_a_worker_spawn_cannot_import_is_refused_up_front(monkeypatch):
    """Spawned ranks import the worker by module and name. A lambda, a nested function or a
    function from a notebook cell (module __main__ without a file) would fail in every child
    with an AttributeError that launch could only report as a crash; refuse it with advice."""
    def nested(rank, world_size):
        return rank

    notebook = types.ModuleType("__main__")  # what a Jupyter kernel's __main__ looks like
    exec("def worker(rank, world_size):\n    return rank", notebook.__dict__)
    monkeypatch.setitem(sys.modules, "__main__", notebook)
    for worker in (nested, lambda rank, world_size: rank, notebook.worker):
        with pytest.raises(ValueError, match="Put it in a module"):
            launch(worker, 2)
    assert multiprocessing.active_children() == []


def test_default_backend_follows_the_machine(monkeypatch):
    """NCCL only when each rank gets a GPU of its own (and torch has NCCL); gloo otherwise, as on
    this CPU machine. Then the same rule on a pretend 4-GPU machine."""
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    assert default_backend(2) == ("nccl" if gpus >= 2 and dist.is_nccl_available() else "gloo")
    assert default_backend(gpus + 1) == "gloo"
    assert worker_device(0, "gloo") == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setattr(dist, "is_nccl_available", lambda: True)
    assert [default_backend(n) for n in (1, 4, 5)] == ["nccl", "nccl", "gloo"]


def test_one_gpu_host_two_ranks_stay_on_the_cpu(monkeypatch):
    """Issue 13, findings 1 and 10: on a host with one GPU, two ranks (the chapter's default)
    run gloo on the CPU, every rank's device is the CPU, and FSDP's mesh is a CPU mesh: no rank
    asks for a GPU (fully_shard's default mesh would follow torch's accelerator, CUDA, and make
    GPU LOCAL_RANK current: "invalid device ordinal" on rank 1)."""
    from gpulab.parallel import data_parallel

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(dist, "is_nccl_available", lambda: True)
    assert default_backend(2) == "gloo"
    assert [worker_device(r, "gloo") for r in (0, 1)] == [torch.device("cpu")] * 2
    monkeypatch.undo()
    results = launch(sharded_state_on_a_one_gpu_host, 2, backend="gloo", timeout=180)
    psi = data_parallel.GPT.count_params(data_parallel.CONFIG)
    for state, asked in results:
        assert asked == [], f"a gloo rank asked for GPU {asked}"
        assert state["params"] == psi and state["fsdp_params"] == psi // 2
        # Chapter 06's FSDP2 lines (issue 27): bf16 compute, fp32 shards and gradients, no
        # reduce-scatter before the last micro-batch, and reshard_after_forward's default (None
        # in torch 2.13, issue 29): the blocks resharded after forward, the root kept whole.
        recipe = state["fsdp2 recipe"]
        assert recipe["compute dtype"] == ["torch.bfloat16"]
        assert recipe["parameter dtype"] == recipe["gradient dtype"] == ["torch.float32"]
        assert recipe["gradients before the last micro-batch"] == 0
        assert recipe["gradients after it"] == recipe["parameter tensors"]
        assert recipe["block sharded after forward"] and not recipe["root sharded after forward"]
        # Issue 36, erratum 13: skipping the gradient sync skips only the reduce-scatter (one
        # per unit, in the last micro-batch); every micro-batch still all-gathers every unit in
        # forward and every block again in backward, unless set_reshard_after_backward(False)
        # keeps them gathered: then only the blocks' backward re-gathers remain after the first.
        units, blocks = recipe["units"], recipe["units"] - 1
        assert recipe["reduce-scatters"] == [0, 0, 0, units]
        assert recipe["all-gathers"] == [units + blocks] * 4
        kept = state["fsdp2 recipe, kept gathered"]
        assert kept["reduce-scatters"] == [0, 0, 0, units]
        assert kept["all-gathers"] == [units + blocks] + [blocks] * 3
        assert kept["gradient sum of this rank's shards"] == pytest.approx(
            recipe["gradient sum of this rank's shards"], rel=1e-6)
    assert sum(state["zero_adam_state"] for state, _ in results) == 2 * psi


def test_every_rank_starts_from_the_cpu_built_model(monkeypatch):
    """Issue 13, finding 2: the ranks and the one-process reference build the GPT on the CPU
    with the same seed and only then move it, so a rank on cuda:r holds the very weights the
    CPU reference starts from (a GPU's generator would give others). Moved here to "meta",
    which any machine has, the model must still have been built on the CPU."""
    from gpulab.parallel import data_parallel

    built_on = []
    real_gpt = data_parallel.GPT

    def recording_gpt(config, *args, **kwargs):
        model = real_gpt(config, *args, **kwargs)
        built_on.append(next(model.parameters()).device)
        return model

    monkeypatch.setattr(data_parallel, "GPT", recording_gpt)
    moved = data_parallel.seeded_gpt(torch.device("meta"))
    assert built_on == [torch.device("cpu")]
    assert next(moved.parameters()).device == torch.device("meta")
    first = data_parallel.seeded_gpt("cpu").state_dict()
    torch.manual_seed(123)  # whatever ran before: the same weights again
    second = data_parallel.seeded_gpt("cpu").state_dict()
    assert all(torch.equal(first[k], second[k]) for k in first)


@pytest.fixture
def one_rank_group():
    """A gloo process group of one rank in this process: enough to run a data-parallel worker's
    code path without spawning anything."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0,
                            world_size=1)
    yield
    gc.collect()                # a test's DDP goes before its group (train_ddp.main says why)
    dist.destroy_process_group()


def test_fsdp2_checkpoint_saves_and_loads_the_sharded_state(one_rank_group, tmp_path):
    """Chapter 06's FSDP2 checkpoint lines (issue 36): get_state_dict + torch.distributed.checkpoint
    save the model and AdamW's state, and a fresh sharded model loads them back exactly."""
    from torch.distributed.fsdp import fully_shard

    from gpulab.parallel import data_parallel

    def sharded():
        model = data_parallel.seeded_gpt("cpu")
        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
        return model, torch.optim.AdamW(model.parameters(), lr=1e-2)

    x, y = data_parallel.next_token_batch(2, 16, seed=0, device="cpu")
    model, optimizer = sharded()
    model(x, y)[1].backward()
    optimizer.step()
    data_parallel.save_sharded(model, optimizer, tmp_path / "step1")
    fresh, fresh_optimizer = sharded()
    data_parallel.load_sharded(fresh, fresh_optimizer, tmp_path / "step1")
    for (name, p), q in zip(model.named_parameters(), fresh.parameters()):
        assert torch.equal(p.full_tensor(), q.full_tensor()), name
        assert torch.equal(optimizer.state[p]["exp_avg"].full_tensor(),
                           fresh_optimizer.state[q]["exp_avg"].full_tensor()), name
    assert not torch.equal(next(fresh.parameters()).full_tensor(),
                           next(data_parallel.seeded_gpt("cpu").parameters()))   # it did step


@pytest.mark.parametrize("mode", ["by hand, per tensor", "by hand, one bucket"])
def test_all_reduce_time_is_taken_between_two_synchronisations(monkeypatch, one_rank_group, mode):
    """Issue 13, finding 3: under NCCL a collective only enqueues work, and backward's kernels
    may still run when the all-reduce is called. The clock must start after a synchronize
    (backward done) and stop after another (the all-reduce done), every step. Recorded here by
    replacing synchronize, the barrier, the all-reduce and the clock with loggers (the barrier
    keeps the wait for a slower rank's backward out of the figure)."""
    from gpulab.parallel import data_parallel

    log = []
    monkeypatch.setattr(data_parallel, "synchronize", lambda device: log.append("sync"))
    monkeypatch.setattr(dist, "barrier", lambda: log.append("barrier"))
    reduce = data_parallel.all_reduce_gradients

    def logged_reduce(*args, **kwargs):
        log.append("all-reduce")
        return reduce(*args, **kwargs)

    monkeypatch.setattr(data_parallel, "all_reduce_gradients", logged_reduce)
    clock = types.SimpleNamespace(perf_counter=lambda: log.append("clock") or time.perf_counter())
    monkeypatch.setattr(data_parallel, "time", clock)
    out = data_parallel.train(0, 1, mode, steps=3, batch=2, seq_len=16)
    timed = "clock sync barrier clock all-reduce sync clock sync clock".split()  # step, comm, comm, step
    assert log == timed * 3
    assert out["comm_seconds"] > 0 and out["allreduce_bytes"] == 4 * data_parallel.GPT.count_params(
        data_parallel.CONFIG)


def test_the_chapter_starts_two_ranks_whatever_the_gpus():
    """Issue 13, finding 10: chapter 06 asks for two ranks, not one per visible GPU (on a shared
    8-GPU server that would open a CUDA context on every GPU for every learner)."""
    import nbformat
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    nb = nbformat.read(os.path.join(root, "solutions/06_data_parallel/06_data_parallel.ipynb"), 4)
    setup = next(c.source for c in nb.cells if "N_RANKS =" in c.source)
    assert re.search(r"^N_RANKS = 2\b", setup, re.M) and "device_count" not in setup


def test_accumulation_on_one_rank_all_reduces_once_and_weighs_every_token(one_rank_group):
    """Chapter 05's loop (issue 27): with no_sync on all but the last micro-batch DDP
    all-reduces once per step, and the token-weighted loss gives one process's gradient of the
    whole batch even with uneven padding; the first loop people write all-reduces k times and is
    off by about the largest gradient. (Two ranks, and the x world_size, run in the chapter,
    whose cell asserts them.)"""
    from gpulab.checkpointing import ddp_accumulation

    out = ddp_accumulation.accumulation_on_ranks(0, 1)
    assert out["valid tokens per micro-batch"] == [64, 32, 16, 8]
    right = out["no_sync, tokens of all ranks x ranks"]
    assert right["all-reduces"] == 1 and right["max |difference|"] < 1e-6
    assert right["times the full batch's"] == pytest.approx(1, abs=1e-6)
    first = out["mean per micro-batch / k, no no_sync"]
    assert first["all-reduces"] == 4 and first["max |difference|"] > 0.3 * out["largest gradient"]


def test_the_torchrun_script_on_one_rank(monkeypatch, capsys):
    """Chapter 06's torchrun script (issue 27), run in this process as torchrun would start a
    single rank: the sampler's shards cover the dataset once per epoch, a new order each epoch,
    one all-reduce per optimizer step, and the global batch of chapter 05's formula."""
    import json

    from gpulab.parallel import train_ddp

    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    for name, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1")):
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    gc.disable()                # so that only main's own collection can free DDP
    try:
        train_ddp.main(["--epochs", "2", "--sequences", "16", "--seq-len", "8"])
        # DDP was freed before its process group: freed after, it can hang the process for good
        alive = [o for o in gc.get_objects() if isinstance(o, torch.nn.parallel.DistributedDataParallel)]
    finally:
        gc.enable()
    assert not alive and not dist.is_initialized()
    summary = json.loads(capsys.readouterr().out.split("summary: ")[1])
    assert summary["global batch"] == 8 and summary["steps"] == 4
    assert summary["samples per rank per epoch"] == 16 and summary["shards cover the dataset once"]
    assert summary["all-reduces per step"] == [1] and summary["tokens per step"] == 8 * 8
    epoch_0, epoch_1 = summary["first samples"]["0"]
    assert epoch_0 != epoch_1                       # set_epoch: a new order each epoch
    assert len(summary["loss per step"]) == 4


def test_the_torchrun_script_saves_on_rank_0_and_resumes(monkeypatch, capsys, tmp_path):
    """Issue 36: a restart (torchrun --max-restarts) runs the script from the top, so it must
    resume from its checkpoint: after one epoch saved, a run asked for two trains only the
    second, from the saved model and optimizer."""
    import json

    from gpulab.parallel import train_ddp

    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    for name, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1")):
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    checkpoint = tmp_path / "checkpoint.pt"
    runs = []
    for epochs in (1, 2, 2):
        monkeypatch.setenv("MASTER_PORT", str(free_port()))
        train_ddp.main(["--epochs", str(epochs), "--sequences", "16", "--seq-len", "8",
                        "--checkpoint", str(checkpoint)])
        runs.append(capsys.readouterr().out)
    first, resumed = (json.loads(out.split("summary: ")[1]) for out in runs[:2])
    assert (first["first epoch"], first["steps"]) == (0, 2)
    assert (resumed["first epoch"], resumed["steps"]) == (1, 2)
    saved = torch.load(checkpoint)
    assert saved["epoch"] == 1 and saved["optimizer"]["state"][0]["step"] == 4   # 2 + 2 steps
    assert "finished all 2 epochs" in runs[2]
