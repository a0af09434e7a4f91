"""The integration tests' marker ``alone`` (tests/all.sh runs them first, one at a time, with
nothing else running; every other file then runs on two workers, a file per worker), and the
order in which those files are handed to the workers: the longest first.

pytest-xdist's ``--dist loadfile`` hands out whole files in collection order (tests/all.sh passes
``--no-loadscope-reorder``; by default xdist sorts the files by their number of tests, which put the
quick-start test, one test of ~300 s, last: the other worker sat idle for most of it). ``LONGEST``
lists the files by their measured time (``--durations=0``, 2 Dec 2026, 2-vCPU build VM: seconds
beside each), longest first; a file not listed follows them in its usual order. The two workers then
finish within seconds of each other (longest-processing-time-first scheduling): the pass took
613 s where it took 672 s (the same tests; the sum of their durations grew from 1003 to 1213 s, the
long files now running beside each other on two vCPUs).
tests/unit/test_integration_order.py fails when a listed file no longer exists.
"""

LONGEST = [
    "test_quickstart_live.py",  # 299
    "test_vllm_service_model_copy_live.py",  # 102
    "test_vllm_service_hub_live.py",  # 100
    "test_vllm_version_live.py",  # 88
    "test_vllm_parser_oracle_more.py",  # 84
    "test_container_runtime_live.py",  # 80
    "test_model_copy_containers_live.py",  # 69
    "test_uma_launch_ranks_live.py",  # 47
    "test_firewall_role_live.py",  # 46
]


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "alone: reads state of the whole machine that other tests change while they run (the kernel's "
        "vm.* values and read_ahead_kb, the page cache, MemAvailable, loop devices) or decides by the "
        "wall clock on a CPU-bound engine: run with no other test beside it",
    )


def pytest_collection_modifyitems(session, config, items):
    """The listed files first, longest first; every file's own tests keep their order (a stable sort)."""
    rank = {name: index for index, name in enumerate(LONGEST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(LONGEST)))
