"""Helpers of the CLI tests: rich's wrapping undone, and what a clean input error looks like."""

from __future__ import annotations


def flat(text: str) -> str:
    """Text with rich's line wrapping undone."""
    return " ".join(text.split())


def assert_clean_failure(result, *needles: str) -> str:
    """Exit code 2, a one-paragraph ``error:`` on stderr naming every needle, no traceback;
    returns the error as one line."""
    assert result.exit_code == 2, result.output
    assert isinstance(result.exception, SystemExit)
    err = result.stderr.strip()
    assert err.startswith("error:") and "Traceback" not in result.output, result.output
    assert "\n\n" not in err  # one paragraph
    bare = "".join(err.split())  # rich may wrap a long path anywhere
    for needle in needles:
        assert needle in flat(err) or "".join(needle.split()) in bare, flat(err)
    return flat(err)
