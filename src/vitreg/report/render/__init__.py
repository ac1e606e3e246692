"""Generic rendering of any verb's report: what a figure looks like inside report.html."""
