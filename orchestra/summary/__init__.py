"""Reporting: the results table, the live progress, the HTML report and the trace of a run folder."""
