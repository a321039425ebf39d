"""A model small enough that a 2-rank profiling job takes seconds on a 2-core CI machine."""

import pytest

from autoparallel.specs.model import ModelSpec

SMALL = ModelSpec(name="prof-small", num_layers=2, hidden_size=64, ffn_hidden_size=128,
                  num_attention_heads=4, num_query_groups=2, vocab_size=128, seq_length=32,
                  activation="swiglu", normalization="rmsnorm", global_batch_size=8)

SMALL_YAML = """name: prof-small
num_layers: 2
hidden_size: 64
ffn_hidden_size: 128
num_attention_heads: 4
num_query_groups: 2
vocab_size: 128
seq_length: 32
activation: swiglu
normalization: rmsnorm
global_batch_size: 8
"""


@pytest.fixture
def small():
    return SMALL


@pytest.fixture
def small_yaml(tmp_path):
    path = tmp_path / "prof-small.yaml"
    path.write_text(SMALL_YAML)
    return path


def run_folder(results):
    """The one run folder a search wrote under `results` (beside it may lie the model's YAML, slurm/, megatron/)."""
    (folder,) = [p for p in results.iterdir() if p.is_dir() and p.name not in ("slurm", "megatron")]
    return folder


# --- a real Slurm cluster (issue 26) ---------------------------------------------------------

import os  # noqa: E402
import shutil  # noqa: E402
import socket  # noqa: E402
import subprocess  # noqa: E402
from pathlib import Path  # noqa: E402

SLURM_SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "slurm_local.sh"


def _slurm_answers() -> bool:
    try:
        return subprocess.run(["sinfo", "-h"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _no_slurm(reason: str):
    """In CI the Slurm tests must run: no cluster is a failure there, a skip elsewhere."""
    if os.environ.get("CI") == "true" or os.environ.get("AUTOPARALLEL_SLURM_REQUIRED") == "1":
        pytest.fail(f"no Slurm cluster in CI: {reason}")
    pytest.skip(reason)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def slurm(tmp_path_factory):
    """SLURM_CONF of a cluster that answers: the one .ci/run started, else one started here by
    scripts/slurm_local.sh where Slurm is installed (on free ports, stopped at the end)."""
    if os.environ.get("SLURM_CONF") and _slurm_answers():
        yield os.environ["SLURM_CONF"]
        return
    if shutil.which("slurmctld") is None:
        _no_slurm("Slurm is not installed (scripts/slurm_local.sh start DIR installs and starts one)")
    folder = tmp_path_factory.mktemp("slurm")
    env = {**os.environ, "SLURMCTLD_PORT": str(_free_port()), "SLURMD_PORT": str(_free_port())}
    try:
        done = subprocess.run([str(SLURM_SCRIPT), "start", str(folder)], capture_output=True, text=True,
                              timeout=180, env=env)
    except subprocess.TimeoutExpired:
        _no_slurm("scripts/slurm_local.sh start did not finish in 180 s")
    if done.returncode != 0:
        subprocess.run([str(SLURM_SCRIPT), "stop", str(folder)], timeout=60)
        _no_slurm(f"slurmctld could not start: {done.stderr.strip()[-300:]}")
    mp = pytest.MonkeyPatch()
    mp.setenv("SLURM_CONF", str(folder / "slurm.conf"))
    try:
        yield str(folder / "slurm.conf")
    finally:
        mp.undo()
        subprocess.run([str(SLURM_SCRIPT), "stop", str(folder)], timeout=60)


# --- a STAND-IN for Megatron-LM (issue 26) ---------------------------------------------------

import textwrap  # noqa: E402

STAND_IN = textwrap.dedent('''
    """STAND-IN for Megatron-LM's pretrain_gpt.py (tests only): prints Megatron-format log lines."""
    import os, sys, time
    if os.environ.get("RANK", "0") != "0":
        sys.exit(0)  # rank 0 prints, as Megatron-LM's logging rank does here
    argv, args, i = sys.argv[1:], {}, 0
    while i < len(argv):
        name = argv[i][2:].replace("-", "_")
        if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            args[name], i = argv[i + 1], i + 2
        else:
            args[name], i = True, i + 1
    iters = int(args["train_iters"])
    short_run = (args.get("mock_data") is True and "save" not in args and "load" not in args
                 and int(args["exit_interval"]) == iters and args["log_interval"] == "1"
                 and args.get("log_throughput") is True)
    if not short_run:
        sys.exit(f"stand-in: not a short profiling run: {sorted(args)}")
    tp, pp = int(args["tensor_model_parallel_size"]), int(args["pipeline_model_parallel_size"])
    if os.environ.get("STAND_IN_HANG"):
        time.sleep(600)
    if tp == int(os.environ.get("STAND_IN_OOM_TP", "0")):
        sys.exit("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB")
    world = int(os.environ["WORLD_SIZE"])
    print("------------------------ arguments ------------------------")
    for name in sorted(args):
        print(f"  {name} {'.' * (48 - len(name))} {args[name]}")
    print("-------------------- end of arguments ---------------------")
    print(f"using world size: {world}, data-parallel size: {world // (tp * pp)}")
    ms = 100.0 * tp + 30.0 * pp  # the stand-in's "measured" time: layout-dependent
    for it in range(1, iters + 1):
        print(f" [2026-11-25 12:00:00.000000] iteration {it:8d}/{iters:8d} | consumed samples: {it * 8:12d} | "
              f"elapsed time per iteration (ms): {ms + (500 if it == 1 else 0):.1f} | "
              f"throughput per GPU (TFLOP/s/GPU): {1000.0 / ms:.1f} | global batch size: {args['global_batch_size']:>5} | "
              "lm loss: 4.8E+00 |")
        if it == 1:
            print("[Rank 0] (after 1 iterations) memory (MB) | allocated: 100.0 | max allocated: 2048.0 | "
                  "reserved: 3000.0 | max reserved: 3072.0")
''')


@pytest.fixture
def stand_in_megatron(tmp_path, monkeypatch):
    """A "Megatron-LM checkout" whose pretrain_gpt.py is the STAND-IN TRAINER above (no Megatron-LM
    nor GPU here): it checks the short-run flags it is given, then prints what Megatron-LM prints
    (the argument block, the world size, one iteration line per iteration with the time and
    TFLOP/s, the memory report), with an iteration time that depends on the layout so that
    measurement re-ranks the table. STAND_IN_OOM_TP=N: the TP N run dies of OOM;
    STAND_IN_HANG=1: it hangs. This checkout is importable in the jobs."""
    root = tmp_path / "megatron-lm"
    root.mkdir()
    (root / "pretrain_gpt.py").write_text(STAND_IN)
    repo = Path(__file__).resolve().parents[2]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(repo), os.environ.get("PYTHONPATH")])))
    return root
