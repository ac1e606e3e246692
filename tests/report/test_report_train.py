"""The train report's reading of a DINO loss: the [CLS] term split into the teacher's entropy and
KL(teacher || student), measured from the step records, and said in words either way."""

from __future__ import annotations

import math

from vitreg.report.renderers.train import dino_reading, loss_figure
from vitreg.results.train import DinoOptions, DinoStep, DinoTerms
from vitreg.train.dino import loss_terms


def history(entropies: list[float], kl: float = 0.04) -> list[dict[str, float]]:
    """Step records of a DINO run whose teacher has these entropies."""
    return [
        {"step": i + 1, "lr": 1e-3, "loss": 2 * h, "loss_dino": h + kl, "loss_ibot": h,
         "teacher_entropy": h}
        for i, h in enumerate(entropies)
    ]  # fmt: skip


def test_a_teacher_turning_uniform_explains_the_rising_loss():
    # as measured on the tiny grid's settings (out_dim 4096, 50 steps): 5.8 -> 1.8 -> 8.34
    terms = loss_terms(history([5.8, 1.7, 7.3, 8.3]), DinoOptions(out_dim=4096))
    assert isinstance(terms, DinoTerms)
    assert terms.lowest == DinoStep(step=2, loss_dino=1.7 + 0.04)
    assert terms.final.kl == terms.final.loss_dino - 8.3
    assert math.isclose(terms.ln_out_dim, math.log(4096))
    text = dino_reading(terms)
    assert "fell to 1.74 at step 2 and ended at 8.34" in text and "ln 4096 = 8.32" in text
    assert "teacher becoming nearly uniform" in text and "not a defect" in text


def test_a_sharp_teacher_is_read_as_telling_images_apart():
    terms = loss_terms(history([5.0, 3.0, 2.0]), DinoOptions())  # the default 4096 prototypes
    assert terms is not None and terms.out_dim == 4096
    assert "well below uniform" in dino_reading(terms)


def test_a_log_without_the_teachers_entropy_has_no_reading():
    records = [{"step": 1, "lr": 1e-3, "loss": 3.0, "loss_dino": 1.0, "loss_ibot": 2.0}]
    assert loss_terms(records, DinoOptions()) is None
    assert loss_figure(records, None).name == "training_loss"
