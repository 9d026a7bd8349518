"""Scoring core: canonical model, step extraction, scorers. Knows no wire format and does no I/O."""
