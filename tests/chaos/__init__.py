"""The chaos run: thousands of jobs of mixed behaviour, several managers, random kills.

`python -m tests.chaos.run --jobs 3000 --managers 3 --seed N` runs it at full
size; `tests/chaos/test_chaos.py` runs a small version in the default suite.
"""
