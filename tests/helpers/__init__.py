"""Test code shared by the tests, the fault report (benchmarks/faults.py) and the benchmarks:
tiny inputs and runs (`helpers.tiny`), fault injection (`helpers.faults`) and the fault cases
(`helpers.fault_cases`). It lives beside the tests, outside the shipped `gpt1` package; pytest puts
tests/ on the path (tests/conftest.py), the benchmarks add it themselves."""
