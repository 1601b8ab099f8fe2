"""Fixtures shared by the real-executor tests: the models of :data:`runtime_helpers.NAMES`
prepared once per module, and plain PyTorch's ``model(x)`` of each (a module that needs
other models defines its own ``repo``)."""

from __future__ import annotations

import pytest
from runtime_helpers import NAMES, model_input, prepare_models, reference


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    return prepare_models(tmp_path_factory.mktemp("repo"), NAMES)


@pytest.fixture(scope="module")
def refs():
    inputs = {name: model_input(name) for name in NAMES}
    return inputs, {name: reference(name, x) for name, x in inputs.items()}
