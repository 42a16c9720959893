"""Suite-wide settings: how tests are spread over pytest-xdist workers.

`.ci/run` and the README's test command run the suite on two workers (`-n 2 --dist
loadgroup`): one group per test file, so a file's module-scoped servers are started once and
its tests run in order on one worker; tests/spark is one group, as its files share one
SparkSession per worker (tests/spark/conftest.py). Without xdist (a plain `pytest tests/...`)
nothing here changes anything.
"""

from __future__ import annotations

import pytest


# tryfirst: xdist's own hook turns the marks into groups, so they must be there before it runs.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.pluginmanager.hasplugin("xdist"):
        return
    for item in items:
        path = item.nodeid.split("::", 1)[0]
        spark = path.startswith("tests/spark/")
        item.add_marker(pytest.mark.xdist_group("spark" if spark else path))
