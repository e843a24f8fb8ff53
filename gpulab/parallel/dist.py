"""Launch N worker processes from a notebook, the way torchrun does.

    results = launch(worker, n_ranks=2, args=(...,))   # worker(rank, world_size, *args) per rank

Why processes: distributed training runs one process per GPU, as torchrun does, each with its
own interpreter and CUDA context. Ranks meet at MASTER_ADDR:MASTER_PORT, a free port each time: a
fixed one (torchrun's 29500) collides when two runs overlap. NCCL when every rank has a GPU of
its own, else gloo with every rank on the CPU (``default_backend``). Two ranks unless the caller
asks for more: on a shared 8-GPU server, a rank per visible GPU would open a CUDA context on
every one of them.
Scripts are launched with ``torchrun --standalone --nproc_per_node=N script.py``; this launcher is
for notebooks, where a rank that raises, dies or hangs must end the run with a LaunchError naming
it, not leave its peers blocked in a collective and the notebook hung, nor outlive the call.

Ranks import ``worker`` by name: a top-level function of a module (e.g.
``gpulab.parallel.collectives``), not of a notebook cell. Results travel back pickled, so workers
return Python values or CPU tensors (``.cpu()``). Each rank is forked from one server process
(multiprocessing's "forkserver") that imported torch and this chapter's modules once
(``PRELOAD``) and then only forks: a fresh interpreter importing torch costs 3-4 CPU-seconds,
which every rank of every launch would pay again under "spawn". The server never touches CUDA
(none of ``PRELOAD`` does at import), so a rank starts CUDA afresh, as safe as spawn on a GPU;
each rank gets the caller's current sys.path, working directory (multiprocessing's own
preparation) and environment (``_run_rank``), as spawn would. The server stays, idle, for the
life of the process that first launched (about 200 MB, shared with the ranks it forks).

``torchrun(module, n_ranks, *args)`` runs a whole training script the way a learner runs their
own, ``torchrun --standalone --nproc_per_node=N -m module args`` (chapter 06, section 7).
"""

from __future__ import annotations

import functools
import gc
import multiprocessing as mp
import os
import pickle
import signal
import socket
import subprocess
import sys
import time
import traceback
from datetime import timedelta
from multiprocessing.connection import wait

import torch
import torch.distributed as dist

POLL_S = 0.1  # how often launch looks for results and dead ranks
GRACE_S = 1.0  # after a first failure, how long the other ranks may take to report theirs
STOP_S = 2.0  # how long a rank may take to exit after SIGTERM before SIGKILL
# What the fork server imports once for all ranks: torch and the workers' modules, FSDP and
# ZeroRedundancyOptimizer (1.7 CPU-s a rank otherwise), and torch._dynamo, which a process's
# first optimizer imports (torch.optim's @torch._disable_dynamo: 2.5 CPU-s). None touches CUDA.
PRELOAD = ("torch", "torch.distributed", "torch._dynamo", "torch.distributed.fsdp",
           "torch.distributed.optim", "gpulab.parallel.collectives", "gpulab.parallel.data_parallel")


class LaunchError(RuntimeError):
    """A launched run failed: the message names the failing ranks and what happened to each;
    ``tracebacks`` holds each failed rank's traceback as text, by rank."""

    def __init__(self, message: str, tracebacks: dict[int, str] | None = None):
        super().__init__(message)
        self.tracebacks = tracebacks or {}


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now: the OS picks one for port 0."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def default_backend(n_ranks: int) -> str:
    """NCCL when every rank can have a GPU of its own, else gloo (which runs on CPU)."""
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return "nccl" if gpus >= n_ranks and dist.is_nccl_available() else "gloo"


def worker_device(rank: int, backend: str | None = None) -> torch.device:
    """Inside a worker: the device this rank computes on, cuda:<rank> under NCCL, else the CPU
    (gloo ranks never touch a GPU, even where one exists). ``backend`` None means the backend of
    the current process group. Pure: ``_run_rank`` already made cuda:<rank> current under NCCL."""
    if (backend or dist.get_backend()) != "nccl":
        return torch.device("cpu")
    return torch.device("cuda", rank)


def worker_mesh(world_size: int, device: torch.device):
    """Inside a worker: a 1-D DeviceMesh of all ranks on the device they really use, for FSDP2.

    Given no mesh, ``fully_shard`` builds one for the accelerator torch was built with, so a
    CUDA mesh wherever CUDA exists, even when the ranks run gloo on the CPU; and a CUDA mesh
    calls ``torch.cuda.set_device(LOCAL_RANK)`` first, which on a one-GPU host fails for rank 1
    ("invalid device ordinal"). An explicit mesh of ``device.type`` does neither."""
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(device.type, (world_size,))


def launch(worker, n_ranks: int = 2, args: tuple = (), timeout: float = 30.0,
           backend: str | None = None) -> list:
    """Run ``worker(rank, n_ranks, *args)`` in ``n_ranks`` processes; return what each returned,
    ordered by rank. Raises LaunchError when a rank raises or dies, or when the whole run (process
    start, 2-5 s on CPU, included) exceeds ``timeout`` seconds, also each collective's timeout."""
    _check_importable(worker)
    backend = backend or default_backend(n_ranks)
    # Not fork: the caller may have started CUDA, and a forked CUDA context is unusable. The
    # fork server has not (module docstring); the preload applies when it first starts.
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(list(PRELOAD))
    port, started = free_port(), time.monotonic()
    deadline = started + timeout  # for the whole run: a hung rank must not hang the notebook
    procs, pipes, replies = [], [], {}
    try:
        for rank in range(n_ranks):
            # A pipe per rank: a rank that dies closes its end, which wakes launch at once.
            recv, send = ctx.Pipe(duplex=False)
            p = ctx.Process(target=_run_rank, name=f"gpulab-rank{rank}", daemon=True,
                            args=(worker, rank, n_ranks, args, port, backend, timeout, send,
                                  dict(os.environ)))
            p.start()
            send.close()  # the child holds the only write end now
            procs.append(p)
            pipes.append(recv)
        while len(replies) < n_ranks and time.monotonic() < deadline:
            pending = [r for r in range(n_ranks) if r not in replies]
            wait([pipes[r] for r in pending] + [procs[r].sentinel for r in pending], POLL_S)
            for rank in pending:
                if (reply := _collect(pipes[rank], procs[rank])) is not None:
                    replies[rank] = reply
            if any(reply[0] != "ok" for reply in replies.values()):
                deadline = min(deadline, time.monotonic() + GRACE_S)  # let the others report
        unfinished = [r for r in range(n_ranks) if r not in replies]
        if failures := [(r, *reply) for r, reply in replies.items() if reply[0] != "ok"]:
            raise LaunchError(_failure_report(failures, unfinished),
                              {rank: tb for rank, _, _, tb, _ in failures if tb})
        if unfinished:
            raise LaunchError(
                f"launch timed out after {time.monotonic() - started:.1f} s (timeout={timeout} s): "
                f"rank(s) {_ranks(unfinished)} had not finished (finished: "
                f"{_ranks(sorted(replies)) or 'none'}). A rank hangs when it waits in a "
                "collective that its peers never join.")
        return [replies[r][1] for r in range(n_ranks)]
    finally:  # also on KeyboardInterrupt: no rank may keep running behind the notebook
        _stop(procs)
        for pipe in pipes:
            pipe.close()


def torchrun(module: str, n_ranks: int = 2, *args: str, timeout: float = 180.0) -> str:
    """Run ``torchrun --standalone --nproc_per_node=n_ranks -m module *args`` (as
    ``python -m torch.distributed.run``, which is what the ``torchrun`` command runs, so that no
    PATH is needed). ``--standalone``: one node, a rendezvous on a free local port. Returns what
    the ranks printed (stdout; torch's warnings on stderr are left out). Raises
    RuntimeError with everything printed when it fails or outlives ``timeout`` seconds; on a
    timeout every process it started is killed."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc_per_node={n_ranks}", "-m", module, *args]
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(      # gpulab importable as here
        p for p in (here, os.environ.get("PYTHONPATH")) if p)}
    env.setdefault("OMP_NUM_THREADS", "1")                 # torchrun would set it, with a warning
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          env=env, start_new_session=True) as process:
        try:
            output, errors = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)          # the agent and every rank it started
            output, errors = process.communicate()
            raise RuntimeError(f"torchrun ran past {timeout} s:\n{output}{errors}") from None
    if process.returncode:
        raise RuntimeError(f"torchrun exited with {process.returncode}:\n{output}{errors}")
    return output                    # stderr holds only torch's warnings when all went well


def _check_importable(worker) -> None:
    """The ranks look the worker up by module and name: fail here, clearly, if they can't."""
    while isinstance(worker, functools.partial):
        worker = worker.func
    module_name = getattr(worker, "__module__", None)
    found = module = sys.modules.get(module_name)
    for part in getattr(worker, "__qualname__", "?").split("."):
        found = getattr(found, part, None)  # "<lambda>" and "<locals>" are never attributes
    in_notebook = module_name == "__main__" and not hasattr(module, "__file__")  # scripts have one
    if found is not worker or in_notebook:
        raise ValueError(
            f"launch cannot pass {worker!r} to its processes: they import it by name, so it must "
            "be a top-level def of a module, not a lambda, a nested function or a notebook cell's "
            "function. Put it in a module (e.g. gpulab.parallel.collectives, or a .py file next to the "
            "notebook), import it, and pass that.")


def _run_rank(worker, rank, world_size, args, port, backend, timeout, conn, env) -> None:
    """The body of each rank: join the group, run the worker, report, clean up. ``env`` is the
    caller's environment at launch (the fork server's is from when it started)."""
    os.environ.clear()
    os.environ.update(env, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank))
    # N ranks x all cores each would oversubscribe. Set explicitly: torch's OpenMP read the
    # variable when the server imported it, perhaps before the caller changed it.
    threads = os.environ.setdefault("OMP_NUM_THREADS", "1")
    if threads.isdigit() and int(threads) > 0:
        torch.set_num_threads(int(threads))
    try:
        device_id = None
        if backend == "nccl":  # NCCL talks to the current device: make it this rank's GPU
            device_id = worker_device(rank, backend)
            torch.cuda.set_device(device_id)
        # device_id binds the group to that GPU: NCCL's communicator is created here, not
        # lazily inside the first (timed) collective, and barrier() knows which GPU to use.
        dist.init_process_group(backend, rank=rank, world_size=world_size,
                                timeout=timedelta(seconds=timeout), device_id=device_id)
        reply = pickle.dumps(("ok", worker(rank, world_size, *args)))
    except BaseException as e:  # KeyboardInterrupt and SystemExit too: launch must hear of them
        reply = pickle.dumps(("error", f"{type(e).__name__}: {e}", traceback.format_exc(),
                              time.time()))
    try:  # report before tearing down: peers blocked in a collective with this rank fail only
        conn.send_bytes(reply)  # once its connections close, so its error reaches launch first
    finally:
        if dist.is_initialized():
            gc.collect()    # a DDP of the worker's, in its reference cycle, goes before its group
            dist.destroy_process_group()    # (gpulab/parallel/train_ddp.py's main says why)


def _collect(pipe, proc):
    """A rank's reply, a "died" reply if it exited without one, or None while it runs."""
    if pipe.poll():
        try:
            return pickle.loads(pipe.recv_bytes())
        except EOFError:  # its end of the pipe closed with nothing sent: the process is dying
            proc.join(STOP_S)
    if proc.exitcode is None:
        return None
    code = proc.exitcode
    name = next((s.name for s in signal.Signals if s == -code), "unknown signal")
    how = f"killed by signal {-code} ({name})" if code < 0 else f"exit code {code}"
    return ("died", f"the process died without reporting a result ({how})", "", time.time())


def _failure_report(failures, unfinished) -> str:
    # Deaths first, then errors in the order they happened: the rank that died or failed first
    # takes its peers' collectives down with it, so the later failures are often consequences.
    failures.sort(key=lambda f: (f[1] != "died", f[4]))  # f: rank, kind, summary, traceback, time
    lines = [f"launch failed: rank {failures[0][0]}: {failures[0][2]}"]
    lines += [f"then rank {r}: {why} (often a consequence)" for r, _, why, _, _ in failures[1:]]
    if unfinished:
        lines.append(f"launch stopped rank(s) {_ranks(unfinished)}, still running.")
    for r, _, _, tb, _ in failures:
        lines += ["", f"--- rank {r} traceback ---", tb.rstrip()] if tb else []
    return "\n".join(lines)


def _stop(procs) -> None:
    """SIGTERM the ranks still running, give them STOP_S to exit, then SIGKILL; reap them all."""
    for p in procs:
        if p.is_alive():
            p.terminate()
    give_up = time.monotonic() + STOP_S
    for p in procs:
        p.join(max(0.0, give_up - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join()


def _ranks(ranks) -> str:
    return ", ".join(map(str, ranks))
