"""Reporting: the results table built from a run folder."""
