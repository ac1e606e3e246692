"""Vision-language models: test-time registers on a LLaVA model's vision tower, and the language
model's attention over the image tokens before and after the fix.

``vitreg.load("hf-vlm:llava-hf/llava-1.5-7b-hf")`` returns the tower as a :class:`~vitreg.Model`
(``model.vlm`` holds the whole VLM); :func:`wrap_vlm` does the same for a loaded
``LlavaForConditionalGeneration``; :func:`run_vlm` compares answers and attention maps.
"""

from vitreg.models.loaders.hf_vlm import VLM, vlm_of, wrap_vlm
from vitreg.vlm.attention import ImageAttention, Reading, capture_rows, feature_site, read, to_grid
from vitreg.vlm.change import answer_change, edit_distance, first_token_change
from vitreg.vlm.inputs import prompt_text, query_positions, token_ids
from vitreg.vlm.run import Condition, ImageResult, VlmResult, condition, run_vlm

__all__ = [
    "VLM",
    "Condition",
    "ImageAttention",
    "ImageResult",
    "Reading",
    "VlmResult",
    "answer_change",
    "capture_rows",
    "condition",
    "edit_distance",
    "feature_site",
    "first_token_change",
    "prompt_text",
    "query_positions",
    "read",
    "run_vlm",
    "to_grid",
    "token_ids",
    "vlm_of",
    "wrap_vlm",
]
