"""Shared settings of the Python module's tests: the Vulkan validation layer is on (any message fails the
step that caused it), and the temporary folder is under the build tree when ctest gives one."""
import os

import pytest


@pytest.fixture
def opts():
    """Compile options every test passes: validation on, as the C++ tests' test::device_options()."""
    return {"validation": True}


@pytest.fixture
def workdir(tmp_path):
    return tmp_path
