"""Run directories: result schema, atomic writers, Markdown/HTML reports and figures."""
