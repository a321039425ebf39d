"""A rank re-runs the parent's ``__main__`` only when what it runs lives there
(``spawn.needs_main``): a job started from a script or the console script no longer imports
that script's imports (the CLI, the cost model, pandas) in every rank."""

import subprocess
import sys
import textwrap

from autoparallel.parallel import spawn

SCRIPT = textwrap.dedent("""
    import operator
    print("main ran", flush=True)
    from autoparallel.parallel import spawn

    def here(rank, world):
        return rank + world

    if __name__ == "__main__":
        for fn in (operator.add, here):  # importable elsewhere, then defined in __main__
            result = spawn.run(fn, 1, timeout=120)
            print("result", result.ok, result.values, flush=True)
""")


def test_needs_main_only_for_what_lives_there():
    assert not spawn.needs_main(spawn.free_port, (1, "x"))
    assert spawn.needs_main(spawn.free_port, (lambda: 0,))  # does not pickle: the default


def test_a_rank_reruns_main_only_when_it_needs_it(tmp_path):
    script = tmp_path / "job_script.py"
    script.write_text(SCRIPT)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=300, check=True).stdout.splitlines()
    # the parent once, the rank of the second run once (it unpickles __main__.here)
    assert out == ["main ran", "result True [1]", "main ran", "result True [1]"], out
