"""ui.figure_cache.figure: a figure is built once per content of its inputs, and never handed out for other inputs."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import clear_app_caches
from core.views import plots


@pytest.fixture
def cache_mod():
    from ui import figure_cache

    clear_app_caches()
    yield figure_cache
    clear_app_caches()


def test_same_content_same_object_other_content_new_figure(cache_mod):
    z = np.random.default_rng(0).random((16, 16)).astype(np.float32)
    edges = np.arange(17) * 4
    a = cache_mod.figure(plots.heatmap, z, edges, (3, 5), None, title="t", zrange=(0.0, 1.0))
    b = cache_mod.figure(plots.heatmap, z.copy(), edges.copy(), (3, 5), None, title="t", zrange=(0.0, 1.0))
    assert a is b  # equal content, other array objects: one build
    z2 = z.copy()
    z2[4, 7] += 0.5  # one cell differs
    c = cache_mod.figure(plots.heatmap, z2, edges, (3, 5), None, title="t", zrange=(0.0, 1.0))
    assert c is not a
    assert np.asarray(c.data[0].z)[4, 7] != np.asarray(a.data[0].z)[4, 7]
    d = cache_mod.figure(plots.heatmap, z, edges, (3, 5), None, title="other", zrange=(0.0, 1.0))
    assert d is not a and d.layout.title.text != a.layout.title.text


def test_fingerprint_tells_types_and_values_apart(cache_mod):
    fp = cache_mod.fingerprint
    assert fp([1, 2]) != fp((1, 2))
    assert fp(np.zeros(4, np.float32)) != fp(np.zeros(4, np.float64))
    assert fp(np.zeros((2, 2))) != fp(np.zeros(4))
    assert fp({"a": 1.0}) != fp({"a": 1.5})
    assert fp(float("nan")) == fp(float("nan"))
    assert fp(np.arange(6)[::2]) == fp(np.array([0, 2, 4]))  # a strided view by its values
    with pytest.raises(TypeError):
        fp(object())
