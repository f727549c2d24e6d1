"""Shared fixtures, Hypothesis profiles and the test tiers.

Fixture plugins live in ``tests/fixtures/``; each issue area adds its own module there
and lists it in ``pytest_plugins`` below.

Tiers. ``launch`` and ``store`` are set here when the tests are collected, from what
the test uses (never by hand, so new tests get theirs too); a test's tier, in reports,
is the first of ``launch``, ``store``, ``slow`` it has:

* ``launch``: it starts processes: ``torchrun``, ``accelerate``, the CLI or a script
  (``subprocess``, ``sys.executable``, ``Popen``), or uses Lightning (a ``Trainer``, or
  just its import: about 2 CPU seconds, charged to the first test that imports it); found in
  the source of the test, of its fixtures and of the module's functions they call (two
  calls deep), and for every test of a ``*launch*`` or ``test_lightning*`` module;
* ``store``: it uses an object-store server: a fixture of ``tests/fixtures/s3.py`` or
  ``tests/fixtures/stores.py`` (directly or through other fixtures), a fixture named
  ``*_server`` / ``*_proxy``, or a source (as above) that names such a fixture;
* ``slow``: marked by hand (``@pytest.mark.slow``, or listed in ``SLOW_TESTS`` below),
  for the rest that is slow.

``make quick`` runs what has none of them (``-m "not launch and not store and not
slow"``, the ``quick`` Hypothesis profile); ``make test`` runs everything.

The budget (``--tier-budget SECONDS``, 2 in ``make``): the tests with no tier whose call
takes more CPU than that are listed, and the ten slowest tests of each tier are printed.
``--tier-budget-fail SECONDS`` fails the run when one takes more than that: 2 in ``make
quick`` (the developer's loop), 10 in ``make test`` (what CI runs). CI's limit has a margin
because CPU seconds differ from machine to machine, under contention, and with the examples
Hypothesis draws (one test took 1.7 and 4.95 CPU seconds in two runs on one machine): a
correct suite must not fail on a slower CI machine, while a test that belongs in a tier (10
s and more) still fails it.

CPU, not wall time: the test's process (all its threads) plus the child
processes that ended during it (DataLoader workers), which a loaded machine does not
inflate the way it stretches wall time (a test waiting on a timeout takes no CPU either).
"""

from __future__ import annotations

import gc
import inspect
import os
import re
import resource
import time
import types
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

pytest_plugins = [
    "tests.fixtures.data",
    "tests.fixtures.e2e",
    "tests.fixtures.examples020",
    "tests.fixtures.iceberg",
    "tests.fixtures.recipes",
    "tests.fixtures.s3",
    "tests.fixtures.stores",
]

settings.register_profile(
    "default",
    deadline=None,
    max_examples=60,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.register_profile(
    "thorough",
    deadline=None,
    max_examples=500,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.register_profile(
    "quick",
    deadline=None,
    max_examples=15,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


@pytest.fixture(autouse=True, scope="module")
def _collect_garbage_per_module() -> Iterator[None]:
    """Collect each test module's cyclic garbage when the module ends.

    A few full runs (2026-11-23) lost an xdist worker to a segmentation fault while the
    cyclic garbage collector ran inside a later, unrelated test (``test_layers.py``,
    ``test_orc.py``), so the culprit's module was unknown. Collected here, a module's
    objects are freed at its own teardown: such a crash is reported against that
    module's last test (one was, in ``test_orc.py``), and objects holding native
    resources (Arrow readers, S3 clients, shared memory) do not outlive their module's
    threads and servers.
    """
    yield
    gc.collect()


# -- tiers ----------------------------------------------------------------------------------------

TIERS = ("launch", "store", "slow")
STORE_FIXTURE_MODULES = ("tests.fixtures.s3", "tests.fixtures.stores")
STORE_FIXTURE = re.compile(r"(_server|_proxy|_proxy_session)$")
STORE_WORDS = re.compile(r"\b(s3_server|moto_server|gcs_server|azure_server|s3_proxy|ThreadedMotoServer)\b")
LAUNCH_WORDS = re.compile(
    r"torchrun|\bsubprocess\.|sys\.executable|\bPopen\b|\bTrainer\("
    r"|importorskip\(\"lightning|\bfrom lightning\b|\bimport lightning\b|torch_dataloader_utils\.lightning"
)
LAUNCH_MODULE = re.compile(r"(launch|^test_lightning)")


def _sources(fn: Callable[..., Any], depth: int, seen: set[int]) -> Iterator[str]:
    """The source of ``fn`` and of its module's functions it names, ``depth`` calls deep."""
    fn = inspect.unwrap(fn)
    if id(fn) in seen or not isinstance(fn, types.FunctionType):
        return
    seen.add(id(fn))
    try:
        yield inspect.getsource(fn)
    except (OSError, TypeError):
        return
    if depth == 0:
        return
    codes = [fn.__code__]
    names: set[str] = set()
    while codes:  # nested functions, lambdas and comprehensions too
        code = codes.pop()
        names.update(code.co_names)
        codes += [c for c in code.co_consts if isinstance(c, types.CodeType)]
    for name in names:
        called = fn.__globals__.get(name)
        if isinstance(called, types.FunctionType) and called.__module__ == fn.__module__:
            yield from _sources(called, depth - 1, seen)


def _tier(item: pytest.Item) -> str | None:
    """``launch`` or ``store`` for a collected test (see the module docstring), or ``None``."""
    function = getattr(item, "function", None)
    module = item.module.__name__.rsplit(".", 1)[-1] if getattr(item, "module", None) else ""
    info = getattr(item, "_fixtureinfo", None)
    fixtures = [] if info is None else [d[-1] for d in info.name2fixturedefs.values() if d]
    store = any(
        STORE_FIXTURE.search(d.argname) or getattr(d.func, "__module__", "") in STORE_FIXTURE_MODULES
        for d in fixtures
    )
    seen: set[int] = set()
    sources = [] if function is None else list(_sources(function, 2, seen))
    for d in fixtures:
        if getattr(d.func, "__module__", "").startswith("tests.") and not d.func.__module__.startswith(
            STORE_FIXTURE_MODULES
        ):
            sources += _sources(d.func, 2, seen)
    text = "\n".join(sources)
    if LAUNCH_MODULE.search(module) or LAUNCH_WORDS.search(text):
        return "launch"
    if store or STORE_WORDS.search(text):
        return "store"
    return None


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--tier-budget",
        type=float,
        default=None,
        help="report the tests with no tier (launch, store, slow) that take more CPU seconds",
    )
    parser.addoption(
        "--tier-budget-fail",
        type=float,
        default=None,
        help="fail the run when a test with no tier takes more CPU seconds than this",
    )


SLOW_TESTS = {
    # Over 1.5 CPU seconds (the budget is 2: a margin for CPU time's own noise), measured
    # with the default Hypothesis profile on 2026-11-27; the slow marker kept here rather
    # than in files that other work edits. Median CPU seconds of the call in two runs.
    "tests/plan/test_reference.py::test_per_rank_planner_matches_the_reference": 4.2,
    "tests/runtime/test_iceberg_properties.py::test_every_live_row_once": 3.1,
    "tests/runtime/test_recipes.py::test_resume_mid_mix_on_other_ranks_reads_each_source_once_per_epoch": 2.6,
    "tests/io/test_mixing.py::test_read_mix_is_the_planned_order": 2.2,
    "tests/runtime/test_elastic.py::test_global_batches_do_not_depend_on_ranks_or_workers": 1.7,
    "tests/runtime/test_elastic.py::test_resume_at_4_ranks_into_2_and_6_gives_the_uninterrupted_batches": 1.8,
    "tests/runtime/test_recipes.py::test_each_source_once_per_its_epoch_with_equal_batches": 1.6,
    "tests/compat/test_examples_docs.py::test_checkpoint_save_and_resume": 1.6,
    "tests/hostile/test_bad_data.py::test_parquet_bad_row_groups_every_good_row_once": 1.4,
    # The orders' properties and the Iceberg continuation (merged later the same day; one run
    # of the whole suite at load 7, CPU seconds of the call).
    "tests/plan/test_blend.py::test_a_pass_takes_full_batches_until_a_limited_source_runs_out": 5.6,
    "tests/runtime/test_mixed_order.py::test_a_resume_in_the_same_world_hands_on_the_same_batches": 5.0,
    "tests/runtime/test_order_contract.py::test_every_order_keeps_the_contract": 4.5,
    "tests/runtime/test_order_matrix.py::test_every_combination_keeps_the_promise_or_is_refused": 3.1,
    "tests/runtime/test_mixed_order.py::test_real_workers_resume_batch_identically": 2.7,
    "tests/runtime/test_iceberg_incremental.py::"
    "test_resume_continued_from_s2_onto_s4_reads_exactly_the_oracles_rows": 1.7,
    "tests/runtime/test_transfer_blocks.py::"
    "test_pinned_pool_reuses_a_slot_only_after_the_copies_queued_from_it": 1.65,
    # Over the budget in the whole suite after the requests merge (load 3-7).
    "tests/runtime/test_transfer.py::test_forked_child_dropping_a_group_does_not_free_its_slot": 2.1,
    "tests/runtime/test_transfer.py::test_pooled_group_roundtrip_and_slot_freed_when_last_view_goes": 2.6,
    "tests/runtime/test_transfer_blocks.py::test_pinned_pool_releases_its_ranges_when_collected": 1.98,
    "tests/runtime/test_transfer_blocks.py::"
    "test_a_held_batch_keeps_its_segment_busy_after_its_group_is_dropped": 1.86,
    # The whole suite after the ledger and mixture merges (load 4-5); Hypothesis draws new
    # examples every run, and these went from 1.5-1.7 to 2-5 CPU seconds between two runs.
    "tests/tools/test_reshard.py::test_every_source_row_lands_in_exactly_one_shard": 4.95,
    "tests/runtime/test_order_contract.py::test_every_orders_state_round_trips": 2.45,
    "tests/hostile/test_cache_findings.py::"
    "test_item_5_loaders_with_their_own_cache_directories_leave_no_descriptor_open": 2.15,
    "tests/runtime/test_recipes.py::test_resume_with_workers_into_other_workers_and_ranks": 1.99,
    "tests/tools/test_ledger.py::test_where_finds_every_step_that_saw_a_row_and_no_other": 1.9,
    "tests/test_doc_recipes.py::test_packed_training_recipe_runs": 1.71,
    "tests/tools/test_ledger.py::test_replay_gives_back_every_batch_the_loop_received": 1.69,
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        name = f"{item.nodeid.split('::')[0]}::{getattr(item, 'originalname', item.name)}"
        if name in SLOW_TESTS and item.get_closest_marker("slow") is None:
            item.add_marker(pytest.mark.slow)
        tier = _tier(item)
        if tier is not None and item.get_closest_marker(tier) is None:
            item.add_marker(getattr(pytest.mark, tier))


def _cpu_seconds() -> float:
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + kids.ru_utime + kids.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    began, cpu = time.perf_counter(), _cpu_seconds()
    yield
    item.user_properties.append(("cpu_s", _cpu_seconds() - cpu))
    item.user_properties.append(("wall_s", time.perf_counter() - began))
    item.user_properties.append(("tier", next((t for t in TIERS if item.get_closest_marker(t)), "quick")))


_TIMINGS: list[tuple[str, str, float, float]] = []  # (tier, nodeid, cpu_s, wall_s)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when != "call":
        return
    props = dict(report.user_properties)
    if "cpu_s" in props:
        _TIMINGS.append((str(props["tier"]), report.nodeid, float(props["cpu_s"]), float(props["wall_s"])))


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    if hasattr(config, "workerinput") or not _TIMINGS:
        return
    write = terminalreporter.write_line
    terminalreporter.section("slowest tests of each tier (CPU seconds of the call; wall seconds)")
    for tier in ("quick", *TIERS):
        timed = sorted((t for t in _TIMINGS if t[0] == tier), key=lambda t: -t[2])
        if timed:
            write(f"{tier}: {len(timed)} tests, {sum(t[2] for t in timed):.0f} CPU s")
            for _, nodeid, cpu, wall in timed[:10]:
                write(f"  {cpu:6.2f} {wall:6.2f}  {nodeid}")
    budget = config.getoption("--tier-budget")
    near = [t for t in _TIMINGS if t[0] == "quick" and budget is not None and 0.75 * budget < t[2] <= budget]
    if near:
        terminalreporter.section("tests with no tier near the budget (over 75 % of it)")
        for _, nodeid, cpu, _ in sorted(near, key=lambda t: -t[2]):
            write(f"  {cpu:6.2f} CPU s  {nodeid}")
    over = [t for t in _TIMINGS if t[0] == "quick" and budget is not None and t[2] > budget]
    if over:
        terminalreporter.section("tests with no tier over the budget", red=True)
        for _, nodeid, cpu, _ in sorted(over, key=lambda t: -t[2]):
            write(f"  {cpu:6.2f} CPU s > {budget:g}  {nodeid}  (mark it slow, or make it cheaper)")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if hasattr(session.config, "workerinput"):
        return
    fail = session.config.getoption("--tier-budget-fail")
    over = fail is not None and any(t[0] == "quick" and t[2] > fail for t in _TIMINGS)
    if over and session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
