"""The real public-domain / CC0 photos bundled with scikit-image, for offline demos."""

from __future__ import annotations

from PIL import Image

from vitreg.errors import InputError, VitregError

# name -> credit; every file ships inside the scikit-image wheel (no download)
SAMPLES: dict[str, str] = {
    "astronaut": "Eileen Collins, NASA (public domain)",
    "coffee": "Rachel Michetti (CC0)",
    "chelsea": "Stefan van der Walt (CC0)",
    "rocket": "SpaceX (public domain)",
    "camera": "Lav Varshney (CC0), greyscale",
    "hubble_deep_field": "NASA Hubble (public domain)",
    "cat": "Stefan van der Walt (CC0)",
    "clock": "Stefan van der Walt (public domain), motion-blurred, greyscale",
    "coins": "Brooklyn Museum (no known copyright restrictions), greyscale",
    "brick": "CC0Textures Bricks25 (CC0), greyscale",
    "grass": "linolafett, DeviantArt (CC0), greyscale",
    "gravel": "CC0Textures Gravel04 (CC0), greyscale",
    "immunohistochemistry": "Center for Microscopy and Molecular Imaging (no known copyright "
    "restrictions)",
    "retina": "Wikimedia Commons, fundus photograph (CC0)",
}
# the first six, the set the trained-backbone plant family draws its crops from
FIRST_SIX: tuple[str, ...] = tuple(list(SAMPLES)[:6])


def sample_images(names: list[str] | None = None) -> list[tuple[str, Image.Image]]:
    """``(name, RGB PIL image)`` pairs of the bundled photos (all of :data:`SAMPLES` by default)."""
    try:
        from skimage import data
    except ImportError as e:
        raise VitregError(
            "sample photos come from scikit-image, which is not installed; "
            "run `pip install vitreg[samples]` (or `pip install scikit-image`)"
        ) from e
    chosen = list(SAMPLES) if names is None else list(names)
    unknown = [n for n in chosen if n not in SAMPLES]
    if unknown:
        raise InputError(f"unknown sample image(s) {unknown}; available: {sorted(SAMPLES)}")
    return [(name, Image.fromarray(getattr(data, name)()).convert("RGB")) for name in chosen]
