"""distlab.measure.timing.VirtualClock.installed: every clock name a notebook can hold reads the virtual one."""
import sys
import time
import timeit

from distlab.measure.timing import VirtualClock


def test_installed_replaces_the_time_module_timeit_and_names_imported_into_main(monkeypatch):
    main = vars(sys.modules["__main__"])
    real = time.perf_counter
    monkeypatch.setitem(main, "perf_counter", real)  # a notebook's `from time import perf_counter`
    monkeypatch.setitem(main, "clock_ns", time.monotonic_ns)  # ... as another name
    clock = VirtualClock()
    with clock.installed():
        clock.advance(2.5)
        assert time.perf_counter() == timeit.default_timer() == main["perf_counter"]() == 1002.5
        assert main["clock_ns"]() == time.time_ns() == 1002_500_000_000
    assert time.perf_counter is real and timeit.default_timer is real and main["perf_counter"] is real
    assert main["clock_ns"] is time.monotonic_ns
