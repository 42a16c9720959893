"""Suite-wide settings: how tests are spread over pytest-xdist workers.

`.ci/run` and the README's test command run the suite on two workers (`-n 2 --dist
loadgroup`): one group per test file, so a file's module-scoped servers are started once and
its tests run in order on one worker; every test that starts a Spark JVM (tests/spark, the
demo and compose runs) shares one group, so two JVMs never compete for the 2 cores and the
memory. Without xdist (a plain `pytest tests/...`) nothing here changes anything.
"""

from __future__ import annotations

import pytest

#: Test files (besides tests/spark/) whose tests start a Spark JVM.
_SPARK_FILES = ("tests/ops/test_demo_progress.py", "tests/ops/test_compose.py")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.pluginmanager.hasplugin("xdist"):
        return
    for item in items:
        path = item.nodeid.split("::", 1)[0]
        spark = path.startswith("tests/spark/") or path in _SPARK_FILES
        item.add_marker(pytest.mark.xdist_group("spark" if spark else path))
