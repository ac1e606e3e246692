"""Run a benchmark script in a subprocess with tiny settings and read the JSON it writes."""

import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import HANG_GUARD_S, ROOT


def run_benchmark(script: str, tmp_path: Path, *args: str) -> dict:
    out = tmp_path / f"{script}.json"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, str(ROOT / "benchmarks" / script), *args, f"--out={out}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=HANG_GUARD_S)
    assert proc.returncode == 0, proc.stderr
    assert "wrote" in proc.stdout
    return json.loads(out.read_text())
