"""Shared fixtures: one build cache for the whole session (so each kernel is
compiled once per run) and helpers to run a config against the reference."""

import os

import numpy as np
import pytest


@pytest.fixture(scope="session", autouse=True)
def session_cache(tmp_path_factory):
    root = tmp_path_factory.mktemp("cache")
    old = os.environ.get("DISPATCHER_CACHE_DIR")
    os.environ["DISPATCHER_CACHE_DIR"] = str(root)
    yield root
    if old is None:
        os.environ.pop("DISPATCHER_CACHE_DIR", None)
    else:
        os.environ["DISPATCHER_CACHE_DIR"] = old


@pytest.fixture
def rng():
    return np.random.default_rng(1234)
