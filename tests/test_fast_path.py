"""scripts/fast_path_if.py, the instrument behind issue 57's measurement of a fast path
chosen at run time: its If forms equal the kernel form for any mask, and genai's form
alone equals it only where the mask has no zero and the positions run on."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

from test_attention import KV_HEADS, _kernel_form_with_head_size, _session, _step_feeds

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import fast_path_if  # noqa: E402

SIZE = 16  # a head size GroupQueryAttention turns itself: the kernel form reads an angle cache


@pytest.fixture(scope="module")
def sessions(tmp_path_factory):
    _, kernel = _kernel_form_with_head_size(SIZE)
    path = tmp_path_factory.mktemp("fast_path") / "kernel.onnx"
    onnx.save(kernel, path)
    forms = {where: fast_path_if.fast_path(path, where, 64) for where in ("model", "layer", "none")}
    return {name: _session(m) for name, m in ({"kernel": kernel} | forms).items()}


@pytest.mark.parametrize("batch,seq,past", [(2, 1, 5), (2, 5, 0), (3, 4, 6)])
def test_the_if_forms_are_exact_and_genais_form_only_on_a_full_mask(sessions, batch, seq, past):
    rng = np.random.default_rng(batch + seq + past)
    feeds = {"holey": _step_feeds(batch, seq, past, rng), "full": _step_feeds(batch, seq, past, rng, padded=False)}
    for f in feeds.values():  # (_step_feeds sizes the cache by the other module's head size)
        f["past_key"], f["past_value"] = (rng.standard_normal((batch, KV_HEADS, past, SIZE)).astype(np.float32)
                                          for _ in range(2))
    for name, f in feeds.items():
        want = sessions["kernel"].run(None, f)
        for where in ("model", "layer"):
            for got, expected in zip(sessions[where].run(None, f), want):
                np.testing.assert_array_equal(got, expected)
        genai = sessions["none"].run(None, f)
        if name == "full":
            for got, expected in zip(genai, want):
                np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
        else:
            assert not np.allclose(genai[0], want[0], rtol=1e-3, atol=1e-3)
