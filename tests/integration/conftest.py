"""The integration tests' marker ``alone`` (tests/all.sh runs them first, one at a time, with
nothing else running; every other file then runs on two workers, a file per worker)."""


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "alone: reads state of the whole machine that other tests change while they run (the kernel's "
        "vm.* values and read_ahead_kb, the page cache, MemAvailable, loop devices) or decides by the "
        "wall clock on a CPU-bound engine: run with no other test beside it",
    )
