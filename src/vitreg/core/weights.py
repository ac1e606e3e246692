"""Where a model's weights come from: the four kinds every loader records and every report
states, so no conclusion is drawn about a trained model from one that was never loaded."""

from __future__ import annotations

from typing import Literal

WeightKind = Literal["trained", "random", "planted", "user"]

#: each kind, as the reports describe it
WEIGHT_KINDS: dict[str, str] = {
    "trained": "trained weights: the source's pretrained ones (hub or cache), or vitreg train's",
    "random": "random, untrained weights (pretrained=False, --random-init)",
    "planted": "synthetic: random weights with planted register neurons (a test fixture)",
    "user": "weights supplied by the user (--weights FILE, a local: folder, vitreg.wrap)",
}
