#!/usr/bin/env bash
# The prepared GPU check: the `gpu` tests (hooks, attention capture and the fix on CUDA in fp32
# and bf16 autocast, against the CPU), the benchmarks' ratios on the GPU (gpu_check.py) and the
# hooked / patterns / kinds arms of hooked_forward.py on DINOv2-L/14 at 518 px, batch 32, bf16,
# with each arm's peak memory, and the plain and kinds arms compiled (torch.compile, inductor;
# compile time apart from the runs), in one JSON with a printed summary. Under 10 minutes on one
# GPU.
#
#   benchmarks/gpu.sh [OUT.json]          (default benchmarks/results/gpu.json)
#
# Without CUDA it takes the CPU fallback path: the same tests with VITREG_TEST_DEVICE=cpu (the
# device checked against itself, small models), gpu_check.py --tiny and the compiled arms with
# the aot_eager backend (no speed-up: it checks the path), so the script is known to run before a
# GPU is at hand. PYTHON picks the interpreter (default: python).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
OUT=${1:-benchmarks/results/gpu.json}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$(dirname "$OUT")"

if "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    MODE=cuda
    TEST_DEVICE=cuda
    BENCH=(--device cuda)
    # diagnose's attention statistics at scale: DINOv2-L/14, 518 px (1374 tokens), batch 32, bf16
    KINDS=(--device cuda --precision bf16 --models vit_large_patch14_dinov2 --sizes 518
           --batch-size 32 --repeats 5 --warmup 1)
    COMPILED=("${KINDS[@]}" --arms kinds --compile inductor)
else
    MODE=cpu-fallback
    TEST_DEVICE=cpu
    BENCH=(--device cpu --tiny)
    KINDS=(--device cpu --models vit_small_patch14_dinov2@2 --sizes 56 --batch-size 2
           --repeats 1 --warmup 1)
    COMPILED=("${KINDS[@]}" --arms kinds --compile aot_eager --no-peak)
    echo "no CUDA device: CPU fallback path (tiny sizes; the figures say nothing about a GPU)"
fi

start=$(date +%s)
set +e
VITREG_TEST_DEVICE=$TEST_DEVICE "$PY" -m pytest -q -m gpu tests/gpu -p no:cacheprovider \
    --junitxml="$WORK/tests.xml"
tests_rc=$?
set -e
tests_s=$(( $(date +%s) - start ))
"$PY" benchmarks/gpu_check.py "${BENCH[@]}" --out "$WORK/bench.json"
"$PY" benchmarks/hooked_forward.py "${KINDS[@]}" --out "$WORK/kinds.json"
set +e  # a model that does not compile leaves the other figures standing
"$PY" benchmarks/hooked_forward.py "${COMPILED[@]}" --out "$WORK/compiled.json"
compiled_rc=$?
set -e
bench_s=$(( $(date +%s) - start - tests_s ))

"$PY" - "$WORK/tests.xml" "$WORK/bench.json" "$OUT" "$MODE" "$tests_rc" "$tests_s" "$bench_s" \
    "$WORK/kinds.json" "$WORK/compiled.json" "$compiled_rc" <<'PYEOF'
import json
import sys
import xml.etree.ElementTree as ET

xml, bench, out, mode, rc, tests_s, bench_s, scale, compiled, compiled_rc = sys.argv[1:]
cases = []
for case in ET.parse(xml).getroot().iter("testcase"):
    kinds = [child.tag for child in case if child.tag in ("failure", "error", "skipped")]
    cases.append({
        "test": f"{case.get('classname')}::{case.get('name')}",
        "outcome": kinds[0] if kinds else "passed",
        "seconds": float(case.get("time", 0)),
    })
counts = {k: sum(c["outcome"] == k for c in cases) for k in ("passed", "failure", "error", "skipped")}
doc = {
    "check": "gpu",
    "mode": mode,
    "tests": {"exit_code": int(rc), "counts": counts, "seconds": int(tests_s), "cases": cases},
    "benchmark_seconds": int(bench_s),
    "benchmark": json.load(open(bench)),
    "kinds_at_scale": json.load(open(scale)),
    "compiled": json.load(open(compiled)) if int(compiled_rc) == 0 else {"exit_code": int(compiled_rc)},
}
with open(out, "w") as f:
    json.dump(doc, f, indent=2)
print(f"\n== vitreg GPU check ({mode}) ==")
print(f"tests: {counts['passed']} passed, {counts['failure'] + counts['error']} failed, "
      f"{counts['skipped']} skipped in {tests_s} s")
b = doc["benchmark"]
print(f"ratios ({b['environment'].get('device')}, batch {b['settings']['batch_size']}, "
      f"{b['settings']['img_size']} px; speed of the second arm over the first) in {bench_s} s:")
for r in b["results"]:
    cells = "  ".join(f"{k} {r[k]['ratio']:.2f} (target {t})" for k, t in b["targets"].items())
    print(f"  {r['model']:<28} {r['precision']:<5} {cells}")
k = doc["kinds_at_scale"]
print(f"diagnose's attention statistics (batch {k['settings']['batch_size']}; speed over plain, "
      "peak memory over plain's):")
for r in k["results"]:
    cells = "  ".join(
        f"{a} {r[f'ratio_{a}_over_plain']:.2f} ({r['peak_ratio_over_plain'][a]:.2f}x memory)"
        for a in ("hooked", "patterns", "kinds")
    )
    print(f"  {r['model']:<28} {r['img_size']} px {r['precision']:<5} {cells}")
c = doc["compiled"]
if "results" not in c:
    print(f"compiled arms: hooked_forward.py --compile exited {c['exit_code']}")
for r in c.get("results", []):
    comp = r["compile"]
    cells = "  ".join(
        f"{a} {r[f'ratio_{a}_over_plain']:.2f}"
        for a in ("plain_compiled", "kinds", "kinds_compiled")
    )
    print(f"compiled ({comp['backend']}; speed over plain): {cells}; compile "
          + ", ".join(f"{a} {t:.0f} s" for a, t in comp["compile_s"].items())
          + f"; {comp['fallbacks']} eager fallbacks")
print(f"wrote {out}")
sys.exit(1 if int(rc) not in (0, 5) else 0)  # 5: no test collected
PYEOF
