"""Mean |error| of the newer summaries' dense rows (kind dense-newer) per GPU, in sample and held out,
between two `autoparallel validate --json` outputs, and each row's error (Markdown tables).

    PYTHONPATH=$PWD python -m autoparallel validate --json > after.json
    python benchmarks/bench_newer_dense_errors.py before.json after.json [--rows]
"""
import json
import sys
from collections import defaultdict


def _rows(path):
    return {x["id"]: x for x in json.load(open(path))["rows"] if x["kind"] == "dense-newer"}


def _group(x):
    return {"b200": "b200/b300", "b300": "b200/b300"}.get(x["gpu"], x["gpu"])


def main(before_path, after_path, rows=False):
    before, after = _rows(before_path), _rows(after_path)
    errors = defaultdict(lambda: defaultdict(list))
    for i in after:
        for tag, d in (("b", before), ("a", after)):
            x = d[i]
            for k in (_group(x), "all"):
                errors[k][tag + "in"].append(abs(x["error_pct"]))
                errors[k][tag + "ho"].append(abs(x["heldout_error_pct"]))
    print("| GPU | rows | in sample before | in sample after | held out before | held out after |")
    print("|---|---|---|---|---|---|")
    for k in ("gb200", "gb300", "h100-sxm", "b200/b300", "all"):
        if k not in errors:
            print(f"| {k} | 0 | - | - | - | - |")
            continue
        v = errors[k]
        m = lambda values: f"{sum(values) / len(values):.1f}"  # noqa: E731
        print(f"| {k} | {len(v['ain'])} | {m(v['bin'])} | {m(v['ain'])} | {m(v['bho'])} | {m(v['aho'])} |")
    if rows:
        print()
        print("| row (bridge-...) | measured | error before | error after | held out after | fits | peak GiB |")
        print("|---|---|---|---|---|---|---|")
        key = lambda i: (after[i]["model"], after[i]["gpu"], i.split("gpu-")[1].split("-tp")[0], i)  # noqa: E731
        for i in sorted(after, key=key):
            x, y = after[i], before[i]
            print(f"| {i[len('bridge-'):]} | {x['measured']:.0f} | {y['error_pct']:+.1f} | {x['error_pct']:+.1f} | "
                  f"{x['heldout_error_pct']:+.1f} | {'yes' if x['fits'] else 'NO'} | {x['peak_memory_gib']:.1f} |")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], "--rows" in sys.argv[3:])
