"""A sample of the models the ``onnx`` wheel ships for its backend tests, through
``taso-egg optimize`` as scripts/backend_models.py runs them all: each goes through with
the expected outputs, or is refused in one line only where onnxruntime itself cannot
run it. (The whole set: ``python scripts/backend_models.py``.)"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import backend_models  # noqa: E402

SAMPLE = ("simple/test_sequence_model4", "simple/test_single_relu_model", "simple/test_expand_shape_model1",
          "pytorch-converted/test_Conv2d", "pytorch-converted/test_Softmax", "pytorch-operator/test_operator_flatten")


@pytest.fixture(scope="module")
def cases():
    return {f"{c.kind}/{c.name}": c for c in backend_models.cases(backend_models.data_root())}


@pytest.mark.parametrize("name", SAMPLE)
def test_backend_model_goes_through_or_is_refused_for_a_reason(name, cases, tmp_path):
    outcome = backend_models.run_case(cases[name], timeout=120, workdir=str(tmp_path))
    assert outcome.verdict in ("ok", "refused"), outcome.detail
    if outcome.verdict == "refused":
        assert not outcome.ort_runs_input, f"refused although onnxruntime runs it: {outcome.detail}"
