"""How far a running load has got (swapgate/control/swaps/load_progress.py), with the fake clock and
stand-in page counts: bytes of the weights read where they tell, else the time share."""

from __future__ import annotations

from pathlib import Path

from swapgate.control.swaps.load_progress import LoadProgress
from swapgate.data.warm import Stage
from tests.unit.fakes import FakeClock

WEIGHTS = {"big": ("/m/big.gguf",)}


def progress(clock: FakeClock, resident: dict[Path, int]) -> LoadProgress:
    return LoadProgress(clock, WEIGHTS, resident.get, lambda path: 4_000_000_000)


def test_a_load_that_reads_its_weights_is_told_in_bytes_read() -> None:
    clock, resident = FakeClock(), {Path("/m/big.gguf"): 0}
    loads = progress(clock, resident)
    loads.began("gpu", "big", expected=10.0)
    resident[Path("/m/big.gguf")] = 1_500_000_000
    clock.advance(1)
    figure = loads.figure("gpu", "big")
    assert figure is not None
    assert (figure.text, figure.ratio) == ("1.5 of 4.0 GB read", 0.375)
    assert loads.ratios() == {("gpu", "big"): 0.375}
    loads.ended("gpu", "big")
    assert loads.figure("gpu", "big") is None
    assert loads.ratios() == {}


def test_weights_already_in_ram_or_unknown_are_told_by_the_measured_time() -> None:
    clock = FakeClock()
    loads = progress(clock, {Path("/m/big.gguf"): 3_900_000_000})  # cached: bytes say nothing
    loads.began("gpu", "big", expected=8.0)
    loads.began("gpu", "small", expected=8.0)  # no weights known
    clock.advance(2)
    for model in ("big", "small"):
        figure = loads.figure("gpu", model)
        assert figure is not None
        assert (figure.text, figure.ratio) == ("about 6 s left", 0.25)
    clock.advance(9)
    late = loads.figure("gpu", "small")
    assert late is not None
    assert (late.text, late.ratio) == ("3 s longer than its usual 8 s", 0.99), "never done"


def test_many_waiters_read_the_pages_once_in_a_while() -> None:
    clock, reads = FakeClock(), []

    def resident(path: Path) -> int:
        reads.append(path)
        return 0

    loads = LoadProgress(clock, WEIGHTS, resident, lambda path: 4_000_000_000)
    loads.began("gpu", "big", expected=10.0)
    before = len(reads)
    for _ in range(50):
        loads.figure("gpu", "big")
    assert len(reads) - before == 1
    clock.advance(0.6)
    loads.figure("gpu", "big")
    assert len(reads) - before == 2


def test_the_engines_own_load_stages_come_before_the_time_share() -> None:
    clock = FakeClock()
    stages = {("router", "gemma"): Stage(1, 2, "text_model", 0.5)}
    loads = LoadProgress(clock, {}, lambda p: None, lambda p: None, lambda i, m: stages.get((i, m)))
    loads.began("router", "gemma", expected=8.0)
    figure = loads.figure("router", "gemma")
    assert figure is not None
    assert (figure.text, figure.ratio) == ("stage 1 of 2 (text_model), 50%", 0.25)


def test_before_any_load_was_measured_no_figure_is_made_up() -> None:
    clock = FakeClock()
    loads = progress(clock, {Path("/m/big.gguf"): 3_900_000_000})
    loads.began("gpu", "small", expected=None)  # the gateway's first load, no expected_swap
    clock.advance(3.4)
    figure = loads.figure("gpu", "small")
    assert figure is not None
    assert figure.text == "loading, 3 s so far"
    assert 0 < figure.ratio < 0.5
    clock.advance(600)
    late = loads.figure("gpu", "small")
    assert late is not None
    assert late.ratio < 1, "it never says done, nor a time left"
