# The bundle's own conftest (trusted: candidates never reach this
# directory, and their workspaces may not hold one): puts the bridge on
# sys.path and ends the workers when the session ends.
import sys

sys.path.insert(0, "/bundle/bridge")

import bridge  # noqa: E402


def pytest_sessionfinish(session, exitstatus):
    bridge.close_all()
