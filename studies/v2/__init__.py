"""Study v2 of the papers' comparisons: PROTOCOL.md, the driver (study.py),
the analysis (analysis.py) and the run records (results/)."""
