"""The one Markdown table helper of the reports: layout and cell escaping."""

from __future__ import annotations

from vitreg.report.markdown import Report, Section, Table, markdown_table, render_markdown


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
