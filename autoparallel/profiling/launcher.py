"""Where a profiling job's processes run: here (``LocalLauncher``) or on a Ray cluster.

Both return a ``Measurement`` and never raise for a failing job: out of memory, a rank that
dies, a hung collective or a timeout become ``ok=False`` with the reason, the processes are
cleaned up, and the caller (a search) goes on. On this machine (no GPU) jobs use gloo on CPU;
with CUDA devices, NCCL and one GPU per rank.

Ray: a whole-layout job reserves a placement group of tp*pp*dp*cp bundles (one GPU each on a GPU
cluster; one CPU each here) and runs one Ray task per rank in its bundle (``RayLauncher``).
"""

from __future__ import annotations

import os
import socket
import time

from autoparallel.errors import UserError
from autoparallel.profiling.job import JobSpec, Measurement, run_rank, summarize

# A CPU rank is a process with torch loaded (about 0.25 GiB resident here) running one thread;
# beyond four ranks per core the step times stop meaning anything, and far beyond it a job of a
# large layout would fork the machine to death.
CPU_RANKS_PER_CORE = 4
CPU_RANK_GIB = 0.5
# The built-in transformer keeps, for each parameter a rank holds, its BF16 weight and its FP32 main
# gradient (the flat buffers of ``ParallelModel.model_state_bytes``): 6 B, before the optimizer's
# states and the activations. A llama3-8b layout on 8 CPU ranks asked for 32 GB a rank and died
# after a minute of start-up; this floor refuses it before any process starts.
CPU_BYTES_PER_HELD_PARAM = 6


def _backend(job: JobSpec) -> str:
    """NCCL for a job on GPUs, gloo on the CPU (``job.device``, "auto": GPUs when torch sees
    them)."""
    from autoparallel.profiling.device import resolve_device
    return "nccl" if resolve_device(job.device) == "cuda" else "gloo"


def local_capacity(gpus: bool | None = None) -> tuple[int, str]:
    """How many ranks one job may have on this machine, and why: one per GPU for a job on GPUs
    (``gpus``; default: when torch sees any), else what the CPU cores and memory allow."""
    import torch
    if torch.cuda.is_available() if gpus is None else gpus:
        n = torch.cuda.device_count()
        return n, f"this machine's {n} GPUs"
    cores = os.cpu_count() or 1
    memory_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    n = max(1, min(CPU_RANKS_PER_CORE * cores, int(memory_gib / CPU_RANK_GIB)))
    return n, (f"the {n} CPU ranks this machine can run ({cores} cores x {CPU_RANKS_PER_CORE}, "
               f"{memory_gib:.0f} GiB at {CPU_RANK_GIB} GiB a rank)")


def too_large(world: int, capacity: tuple[int, str]) -> str:
    """'' if a job of ``world`` ranks fits ``capacity``, else why not."""
    n, what = capacity
    return "" if world <= n else f"a job of {world} ranks is larger than {what}"


def held_parameters(model, plan) -> int:
    """The parameters all ranks of ``plan`` hold together, at least: each rank a 1/(tp*pp) share of
    the dense weights and a 1/(tp*pp*ep) share of the routed experts'."""
    experts = sum(count for kind, count in model.layer_kind_counts.items() if kind in ("moe", "E"))
    experts *= (model.num_experts or 0) * model.expert_params
    per_rank = (model.num_parameters - experts) / (plan.tp * plan.pp) + experts / (plan.tp * plan.pp * plan.ep)
    return int(per_rank * plan.num_gpus)


def too_large_for_memory(model, plan) -> str:
    """'' if a CPU job of ``plan`` may fit this machine's memory, else why not (its weights and
    gradients alone are more than the machine has)."""
    memory_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    need_gib = held_parameters(model, plan) * CPU_BYTES_PER_HELD_PARAM / 2**30
    if need_gib <= memory_gib:
        return ""
    return (f"its {plan.num_gpus} CPU ranks need at least {need_gib:,.0f} GiB for {model.name}'s weights and "
            f"gradients alone ({CPU_BYTES_PER_HELD_PARAM} B a parameter a rank holds), more than this "
            f"machine's {memory_gib:,.0f} GiB")


def run_local(job: JobSpec) -> Measurement:
    """The job on ``plan.num_gpus`` processes of this machine."""
    from autoparallel.parallel import spawn
    world = job.plan.num_gpus
    start, started_at = time.perf_counter(), time.time()
    try:
        from autoparallel.parallel.parallelize import check_plan
        check_plan(job.model, job.plan, world)
    except (ValueError, NotImplementedError) as exc:
        return Measurement(ok=False, reason=f"not runnable: {exc}", world_size=world)
    try:
        backend = _backend(job)
    except ValueError as exc:
        return Measurement(ok=False, reason=f"not runnable: {exc}", world_size=world)
    if why := too_large(world, local_capacity(gpus=backend == "nccl")):
        return Measurement(ok=False, world_size=world, reason=why)
    if backend == "gloo" and (why := too_large_for_memory(job.model, job.plan)):
        return Measurement(ok=False, world_size=world, reason=why)
    result = spawn.run(run_rank, world, (job,), timeout=job.timeout_s, backend=backend,
                       collective_timeout_s=min(job.timeout_s, 120.0),
                       threads=job.threads_per_rank)
    wall = time.perf_counter() - start
    if not result.ok:
        return Measurement(ok=False, reason=result.reason, world_size=world, wall_s=wall)
    return summarize(job, result.values, wall, started_at, time.time())


class LocalLauncher:
    name = "local"

    def capacity(self) -> tuple[int, str]:
        return local_capacity()

    def run(self, job: JobSpec) -> Measurement:
        return run_local(job)


class RayLauncher:
    """A job = a placement group of one bundle per rank (one GPU each on a GPU cluster, one CPU
    here) and one Ray task per rank pinned to its bundle; rank 0's node and a free port there
    form the rendezvous, so a layout may span nodes (PACK strategy). ``ray.get`` with the job's
    timeout, then removing the placement group (which kills the ranks on it), bounds a hung job;
    a whole job is retried ``max_retries`` times when Ray reports a system failure (a worker or
    node lost), never for an application error.
    """

    name = "ray"

    def __init__(self, address: str | None = None, max_retries: int = 0,
                 init_kwargs: dict | None = None) -> None:
        try:
            import ray
        except ImportError as exc:  # an optional dependency fails when used, not imported
            raise UserError("--executor ray needs Ray: pip install 'autoparallel[ray]'") from exc
        self.ray = ray
        if not ray.is_initialized():
            check_reachable(address)
            check_token(address)
            try:
                ray.init(address=address, **(init_kwargs or {}))
            except (ConnectionError, RuntimeError, ValueError) as exc:
                raise UserError(f"--ray-address {address}: Ray could not connect: "
                                f"{' '.join(str(exc).split())[:200]}{token_hint(address)}") from None
        self.max_retries = max_retries

    def capacity(self, gpus: bool | None = None) -> tuple[int, str]:
        """The cluster's GPUs for a job on GPUs (``gpus``; default: when it has any), else its CPUs."""
        resources = self.ray.cluster_resources()
        kind = "GPU" if (resources.get("GPU") if gpus is None else gpus) else "CPU"
        n = int(resources.get(kind, 0))
        return n, f"the Ray cluster's {n} {kind}s"

    def run(self, job: JobSpec) -> Measurement:
        for attempt in range(self.max_retries + 1):
            m, system_failure = self._run_once(job)
            if m.ok or not system_failure:
                break
        return m

    def _run_once(self, job: JobSpec) -> tuple[Measurement, bool]:
        from ray.util.placement_group import placement_group, remove_placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
        ray, world = self.ray, job.plan.num_gpus
        try:
            from autoparallel.parallel.parallelize import check_plan
            check_plan(job.model, job.plan, world)
        except (ValueError, NotImplementedError) as exc:
            return Measurement(ok=False, reason=f"not runnable: {exc}", world_size=world), False
        has_gpu = bool(ray.cluster_resources().get("GPU"))
        if job.device == "cuda" and not has_gpu:
            return Measurement(ok=False, world_size=world, reason=(
                "not runnable: device cuda, but the Ray cluster has no GPUs")), False
        gpu = has_gpu and job.device != "cpu"
        if why := too_large(world, self.capacity(gpu)):
            return Measurement(ok=False, world_size=world, reason=why), False
        bundle = {"GPU": 1, "CPU": 1} if gpu else {"CPU": 1}
        pg = placement_group([bundle] * world, strategy="PACK")
        start = time.perf_counter()

        def left() -> float:  # one deadline covers placing, starting and running the ranks
            return max(0.0, job.timeout_s - (time.perf_counter() - start))

        def on(index: int):
            return PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=index)
        try:
            try:
                ray.get(pg.ready(), timeout=left())
            except ray.exceptions.GetTimeoutError:
                return Measurement(ok=False, world_size=world, reason=(
                    f"Ray could not place {world} bundles of {bundle} in {job.timeout_s:.0f} s")), False
            resources = {"num_cpus": 1, "num_gpus": 1 if gpu else 0}
            address = ray.get(ray.remote(_rendezvous).options(
                scheduling_strategy=on(0), **resources).remote(), timeout=left())
            task = ray.remote(_ray_rank)
            refs = [task.options(max_retries=0, scheduling_strategy=on(r), **resources)
                    .remote(r, world, job, address, "nccl" if gpu else "gloo")
                    for r in range(world)]
            values = ray.get(refs, timeout=left())
        except ray.exceptions.GetTimeoutError:
            return Measurement(ok=False, world_size=world, wall_s=time.perf_counter() - start,
                               reason=f"timed out after {job.timeout_s:.0f} s (Ray)"), False
        except (ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError,
                ray.exceptions.ActorDiedError) as exc:
            return Measurement(ok=False, world_size=world, wall_s=time.perf_counter() - start,
                               reason=f"a rank died: {str(exc).splitlines()[0][:300]}"), True
        except ray.exceptions.RayTaskError as exc:
            cause = exc.cause if getattr(exc, "cause", None) is not None else exc
            text = f"{type(cause).__name__}: {str(cause).splitlines()[0][:300]}"
            oom = "out of memory" in text.lower()
            return Measurement(ok=False, world_size=world, wall_s=time.perf_counter() - start,
                               reason=("out of memory: " if oom else "rank failed: ") + text), False
        finally:
            # Removing the placement group kills the ranks still running on it. No
            # ray.cancel(force=True): force-cancelling a task whose reply is on its way trips a
            # check in Ray 2.60's task manager that ends the driver process (exit code 1, no
            # message), and a wait() before it only narrows that window.
            remove_placement_group(pg)
        return summarize(job, values, time.perf_counter() - start), False


def _rendezvous() -> str:
    import ray

    from autoparallel.parallel.spawn import free_port
    return f"{ray.util.get_node_ip_address()}:{free_port()}"


def _ray_rank(rank: int, world: int, job: JobSpec, address: str, backend: str) -> dict:
    import datetime

    import torch
    import torch.distributed as dist
    if job.threads_per_rank:
        torch.set_num_threads(job.threads_per_rank)
    dist.init_process_group(backend, init_method=f"tcp://{address}", rank=rank,
                            world_size=world,
                            timeout=datetime.timedelta(seconds=min(job.timeout_s, 120.0)))
    try:
        return run_rank(rank, world, job)
    finally:
        dist.destroy_process_group()


def check_reachable(address: str | None, timeout_s: float = 5.0) -> None:
    """A UserError at once, instead of Ray's minutes of retries, when nothing listens at a
    ``host:port`` (or ``ray://host:port``) cluster address. No address, or ``auto``/``local``,
    is Ray's to resolve."""
    if not address or address in ("auto", "local"):
        return
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UserError(f"--ray-address {address!r} is not host:port (or ray://host:port, auto, local)")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            pass
    except OSError as exc:
        why = exc.strerror or type(exc).__name__
        raise UserError(f"--ray-address {address}: nothing answers at {host}:{port} ({why}); is the Ray "
                        "head running (`ray start --head`)?") from None


def _token_source() -> str:
    """Where Ray's client finds an authentication token (Ray's token-auth docs), '' if nowhere."""
    if os.environ.get("RAY_AUTH_TOKEN"):
        return "RAY_AUTH_TOKEN"
    path = os.environ.get("RAY_AUTH_TOKEN_PATH") or os.path.expanduser("~/.ray/auth_token")
    return path if os.path.isfile(path) else ""


def check_token(address: str | None) -> None:
    """RAY_AUTH_MODE=token without a token is refused at once (Ray would retry for seconds)."""
    if address and os.environ.get("RAY_AUTH_MODE") == "token" and not _token_source():
        raise UserError(f"--ray-address {address}: RAY_AUTH_MODE=token but no token: set RAY_AUTH_TOKEN, or copy "
                        "the head node's ~/.ray/auth_token here (or point RAY_AUTH_TOKEN_PATH at it)")


def token_hint(address: str | None) -> str:
    """What to set when a connection fails without token authentication: Ray >= 2.59 turns it
    on for clusters started with `ray start`, and a client must then ask for it."""
    if not address or address in ("auto", "local") or os.environ.get("RAY_AUTH_MODE") == "token":
        return ""
    return ("; a cluster started with `ray start` (Ray >= 2.59) requires token authentication: set "
            "RAY_AUTH_MODE=token, with the token in RAY_AUTH_TOKEN or ~/.ray/auth_token (from the head node)")


def make_launcher(executor: str = "local", address: str | None = None):
    if executor == "local":
        return LocalLauncher()
    if executor == "ray":
        return RayLauncher(address)
    raise UserError(f"--executor {executor!r} is not valid; choose local or ray")
