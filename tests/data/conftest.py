import pytest


@pytest.fixture(scope="module")
def target(tiny_target):
    return tiny_target
