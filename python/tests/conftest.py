"""Shared settings of the Python module's tests: the Vulkan validation layer is on, and any message it reports
fails the step that caused it (as the C++ tests' test::device_options())."""
import pytest


@pytest.fixture
def opts():
    """Compile options every test passes."""
    return {"validation": True}


@pytest.fixture
def workdir(tmp_path):
    return tmp_path
