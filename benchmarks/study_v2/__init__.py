"""Study v2 of the papers' comparisons: PROTOCOL.md, the driver (study.py)
and the run records (results/)."""
