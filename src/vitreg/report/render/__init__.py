"""Generic rendering of any verb's report: its structure and Markdown (``markdown``), the
envelope's sections (``envelope``), the self-contained HTML page (``html``, ``templates/``),
plots (``plots``) and images as report.html shows them (``images``)."""
