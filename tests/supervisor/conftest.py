"""The process tests' fixtures come from tests/conftest.py (see tests/processes.py)."""
