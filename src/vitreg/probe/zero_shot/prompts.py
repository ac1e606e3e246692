"""Prompts for CLIP zero-shot classification: the 80 OpenAI ImageNet templates (open_clip's own
list when open_clip is installed, else the copy shipped next to this file), a user's templates
file, and the class names a dataset gives (ImageNet WordNet-id folders mapped to readable names).
"""

from __future__ import annotations

import re
from pathlib import Path

from vitreg.errors import InputError

TEMPLATES_FILE = Path(__file__).with_name("openai_imagenet_templates.txt")
WNID = re.compile(r"n\d{8}")


def openai_templates() -> list[str]:
    """The 80 prompt templates of OpenAI's ImageNet zero-shot ensemble, each with one ``{}``."""
    try:
        from open_clip.zero_shot_metadata import OPENAI_IMAGENET_TEMPLATES
    except ImportError:
        return read_templates(TEMPLATES_FILE)
    return [template("{}") for template in OPENAI_IMAGENET_TEMPLATES]


MAX_TEMPLATES = 1000  # a prompt ensemble; OpenAI's ImageNet one has 80
MAX_TEMPLATES_BYTES = 2**20


def read_templates(path: str | Path) -> list[str]:
    """Templates from a text file, one per line with exactly one ``{}`` (blank lines skipped);
    at most :data:`MAX_TEMPLATES` of them in at most 1 MiB."""
    path = Path(path)
    try:
        if path.stat().st_size > MAX_TEMPLATES_BYTES:
            raise InputError(
                f"the templates file {str(path)!r} is {path.stat().st_size / 2**20:.1f} MiB; a "
                f"prompt ensemble is at most {MAX_TEMPLATES} short lines (1 MiB)"
            )
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"cannot read the templates file {str(path)!r}: {e}") from None
    templates = [line.strip() for line in lines if line.strip()]
    bad = [t for t in templates if t.count("{}") != 1 or _has_other_braces(t)]
    if bad or not templates:
        problem = f"{len(bad)} lines without exactly one {{}}, e.g. {bad[0]!r}" if bad else "none"
        raise InputError(
            f"the templates file {str(path)!r} needs one template per line with exactly one "
            f"{{}} where the class name goes (e.g. 'a photo of a {{}}.'); found {problem}"
        )
    if len(templates) > MAX_TEMPLATES:
        raise InputError(
            f"the templates file {str(path)!r} holds {len(templates):,} templates; vitreg "
            f"averages at most {MAX_TEMPLATES:,} (OpenAI's ImageNet ensemble has 80), since each "
            "is one text-tower pass per class: keep the templates that matter"
        )
    return templates


def _has_other_braces(template: str) -> bool:
    rest = template.replace("{}", "", 1)
    return "{" in rest or "}" in rest


def class_names(names: list[str] | None, spec: str) -> tuple[list[str], list[str]]:
    """Readable class names for the prompts, and notes on how they were obtained.

    Folder names have ``_`` turned into spaces; the 1000 sorted ImageNet WordNet ids (an
    ImageNet ``val/<wnid>/`` folder) become open_clip's ``IMAGENET_CLASSNAMES`` in that order.
    """
    if not names:
        raise InputError(
            f"zero-shot needs class names and {spec} gives none; use a dataset with named "
            "classes (imagefolder:DIR takes the class folder names)"
        )
    if all(WNID.fullmatch(n) for n in names):
        if len(names) != 1000 or names != sorted(names):
            raise InputError(
                f"the classes of {spec} are {len(names)} WordNet ids (e.g. {names[0]!r}), which "
                "make meaningless prompts; vitreg maps only the full sorted set of 1000 ImageNet "
                "ids; rename the class folders to readable names"
            )
        try:
            from open_clip.zero_shot_metadata import IMAGENET_CLASSNAMES
        except ImportError as e:
            raise InputError(
                f"the classes of {spec} are the 1000 ImageNet WordNet ids; their readable names "
                "come from open_clip: pip install 'vitreg[openclip]'"
            ) from e
        return list(IMAGENET_CLASSNAMES), [
            "class folders are the 1000 ImageNet WordNet ids: prompts use open_clip's "
            "IMAGENET_CLASSNAMES in sorted-id order"
        ]
    readable = [n.replace("_", " ").strip() for n in names]
    changed = sum(a != b for a, b in zip(names, readable, strict=True))
    notes = [f"{changed} class names had '_' turned into spaces"] if changed else []
    return readable, notes
