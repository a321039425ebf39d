"""Report generation time on a 100k-candidate run, and a check in headless Chromium that
report.html's images render (issue 5: under 10 s).

    python benchmarks/bench_report.py [--screenshot report.png]

Chromium is optional (Debian package `chromium`); without it the render check is skipped with
a message. The check counts the pixels of the scatter plot's colour in the screenshot.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

from autoparallel import io
from autoparallel.search import run
from autoparallel.space import load_space

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--window-size=1300,1900"]
SCATTER_RGB = np.array([0x1F, 0x77, 0xB4]) / 255  # matplotlib default blue: "fits" points, compute bars


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--screenshot", default="", help="keep the screenshot at this path")
    args = parser.parse_args()
    model, hw = io.load_model("175b"), io.load_hardware("h100-sxm")
    with tempfile.TemporaryDirectory() as tmp:
        result = run.search(model, hw, 1024, 2048, load_space())
        run_dir = run.save(result, Path(tmp), ["bench"])
        start = time.perf_counter()
        page = run.report(run_dir)
        seconds = time.perf_counter() - start
        print("| candidates | report s | report.html KiB | images render |")
        print("|---|---|---|---|")
        render = check_render(page, Path(args.screenshot) if args.screenshot else Path(tmp) / "shot.png")
        print(f"| {len(result.ranked):,} | {seconds:.2f} | {page.stat().st_size / 1024:.0f} | {render} |")


def check_render(page: Path, shot: Path) -> str:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if not browser:
        return "not checked (no chromium)"
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run([browser, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--screenshot={shot}",
                        page.as_uri()], capture_output=True, timeout=120, check=True)
    import matplotlib.image
    pixels = matplotlib.image.imread(shot)[..., :3]
    blue = int((np.abs(pixels - SCATTER_RGB).max(axis=-1) < 0.03).sum())
    return f"yes ({blue:,} plot pixels)" if blue > 1000 else f"NO ({blue} plot pixels)"


if __name__ == "__main__":
    main()
