"""The one Markdown table helper of the reports: layout and cell escaping."""

from __future__ import annotations

from vitreg.report.render.markdown import Report, Section, Table, markdown_table, render_markdown


def test_table_layout() -> None:
    table = Table(["a", "b"], [["1", "`x`"], [2, None]])
    assert markdown_table(table) == "| a | b |\n|---|---|\n| 1 | `x` |\n| 2 | None |\n"


def test_pipe_and_line_breaks_are_escaped_in_one_place() -> None:
    table = Table(["rule | value", "note"], [["|x| > 4", "two\nlines"], ["a\r\nb", "c\rd"]])
    expected = "| rule \\| value | note |\n|---|---|\n| \\|x\\| > 4 | two lines |\n| a b | c d |\n"
    assert markdown_table(table) == expected
    # a report renders its tables through the same helper
    report = Report(None, "t", [Section("s", "S", [table])])
    assert render_markdown(report) == "# t\n\n## S\n\n" + expected


def test_html_tables_align_numbers_right_prose_left_and_never_break_a_header_word() -> None:
    import re

    from vitreg.report.render.html import align, render_html

    numbers = ["0.25", "–", "12.5%", "-3e-05", "1.2 – 3.4", "0.25 ± 0.1", "3.1 (block 4)", "yes"]
    prose = ["`blocks.3.hook_resid_post`", "patch embedding", "cause (writes the outliers)"]
    assert [align(c) for c in numbers] == ["num"] * len(numbers)
    assert [align(c) for c in prose] == ["txt"] * len(prose)
    table = Table(["block", "specialised", "tokens"], [["0", "patch embedding", "0.5"]])
    page = render_html(Report(None, "t", [Section("s", "S", [table])]), [], None)
    assert '<td class="txt">patch embedding</td><td class="num">0.5</td>' in page
    assert '<th class="txt">specialised</th><th class="num">tokens</th>' in page
    rule = re.search(r"th, td:first-child \{([^}]*)\}", page)
    assert rule and "overflow-wrap: normal" in rule.group(1)  # headers break between words only
    assert re.search(r"th\.txt, td\.txt[^{]*\{[^}]*text-align: left", page)


def test_a_column_is_aligned_as_a_whole_header_included() -> None:
    """A prose column with a dash or a yes in it stays left-aligned, its header too; a column of
    numbers with a missing value stays right-aligned."""
    from vitreg.report.render.html import column_aligns, render_html

    table = Table(
        ["block", "what it does", "rate", "note"],
        [["0", "patch embedding", "0.5", "–"], ["1", "–", "–", "–"], ["2", "yes", "0.25", "–"]],
    )
    assert column_aligns(table) == ["num", "txt", "num", "txt"]
    page = render_html(Report(None, "t", [Section("s", "S", [table])]), [], None)
    assert '<th class="txt">what it does</th><th class="num">rate</th>' in page
    assert '<td class="num">2</td><td class="txt">yes</td><td class="num">0.25</td>' in page
