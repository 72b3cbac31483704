"""Differential harness: the same scenarios in a stock process and in one that imports aliasguard.

See docs/differential.md. Entry point: ``python test/differential/run.py``.
"""
