from __future__ import annotations

from swapgate.catalog import Catalog
from swapgate.config import parse_config
from swapgate.errors import DriverError
from swapgate.metrics import Metrics
from swapgate.poller import Poller
from swapgate.registry import Registry
from swapgate.state import InstanceReport, WarmState


class Flaky:
    """Answers with ``a`` warm unless ``failing``."""

    failing = False

    async def state(self) -> InstanceReport:
        if self.failing:
            raise DriverError("no answer")
        return InstanceReport({"a": WarmState.WARM}, None)


def state(registry: Registry, model: str) -> WarmState:
    return registry.snapshot().instance("x").state_of(model)


async def test_one_failed_poll_is_forgiven_two_take_the_instance_down() -> None:
    settings = parse_config({"instances": [{"name": "x", "url": "http://x"}]})
    registry = Registry(settings.instances, Catalog(settings))
    driver = Flaky()
    poller = Poller(registry, {"x": driver}, Metrics(), interval=1)
    await poller.poll("x")
    driver.failing = True
    await poller.poll("x")
    assert registry.is_up("x")
    await poller.poll("x")
    assert not registry.is_up("x")
    assert state(registry, "a") is WarmState.COLD
    driver.failing = False
    await poller.poll("x")
    assert registry.is_up("x")
