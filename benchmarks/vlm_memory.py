"""Peak memory of ``vitreg.vlm.run_vlm`` on the tiny offline LLaVA, for 1 and 8 images.

Each arm runs in a fresh process: save the tiny LLaVA (planted ``hf_clip_t16`` tower, 2-layer
Llama), load it as ``hf-vlm:DIR``, then answer a prompt per image without and with test-time
registers (the planted units) and read the language->image attention rows. The peak resident
set size of the process (``ru_maxrss``) is recorded after the load and after the run; the
difference is what the images cost. The attention capture keeps only the rows asked for, so the
run's cost should not grow with the number of images beyond the per-image results.

    python benchmarks/vlm_memory.py [--images 1,8] [--max-new-tokens 8]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from _common import (
    RESULTS,
    emit,
    parse_quick,
    parser,
    peak_rss_mb,
    run_child,
    write_result,
)

BENCHMARK = "vlm_memory"


def child(n_images: int, max_new_tokens: int) -> dict:
    """One arm: load, run ``n_images`` images, report peak RSS after each phase."""
    import json as _json
    import warnings

    import vitreg
    from vitreg import NeuronSet, TestTimeRegisters
    from vitreg.testing.images import synthetic_pil
    from vitreg.testing.planted import save_tiny_llava
    from vitreg.vlm import run_vlm

    with tempfile.TemporaryDirectory() as tmp:
        folder = save_tiny_llava(Path(tmp) / "tiny")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            model = vitreg.load(f"hf-vlm:{folder}")
        truth = _json.loads((folder / "vitreg_planted.json").read_text())["ground_truth"]
    units = truth["units"]
    neurons = NeuronSet.from_pairs(units, model)
    images = model.preprocess(synthetic_pil(n_images, 112, 0, 0.3))
    loaded = peak_rss_mb()
    result = run_vlm(
        model, images, "What is in the image?", TestTimeRegisters(neurons), max_new_tokens
    )
    return {
        "n_images": n_images,
        "peak_rss_mb_after_load": loaded,
        "peak_rss_mb_after_run": peak_rss_mb(),
        "n_answer_tokens": [len(r.before.results.answer_tokens) for r in result.images],
    }


def main(argv: list[str] | None = None) -> None:
    p = parser(__doc__)
    p.add_argument("--images", default="1,8", help="comma-separated image counts, one process each")
    p.add_argument("--max-new-tokens", type=int, default=8)
    p.add_argument("--out", default=str(RESULTS / f"{BENCHMARK}.json"))
    p.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = parse_quick(p, argv, images="1,2", max_new_tokens=4)
    if args.child is not None:
        emit(child(args.child, args.max_new_tokens))
        return
    arms = [
        run_child(__file__, [f"--child={n}", f"--max-new-tokens={args.max_new_tokens}"])
        for n in (int(x) for x in args.images.split(","))
    ]
    path = write_result(args, BENCHMARK, arms=arms)
    for arm in arms:
        print(
            f"{arm['n_images']} image(s): peak RSS {arm['peak_rss_mb_after_load']:.0f} MB after "
            f"load, {arm['peak_rss_mb_after_run']:.0f} MB after the run"
        )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
