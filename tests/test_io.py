"""archlab.io: JSON written atomically, numpy scalars as the Python values they hold."""

import json

import numpy as np
import pytest

from archlab.io import write_json_atomic


def test_numpy_scalars_are_written_as_python_values(tmp_path):
    path = write_json_atomic(tmp_path / "r.json", {"resolved": np.bool_(True), "p": np.float64(0.25),
                                                   "n": np.int64(3)})
    assert json.loads(path.read_text()) == {"resolved": True, "p": 0.25, "n": 3}


def test_an_object_json_cannot_hold_is_refused_and_nothing_is_written(tmp_path):
    with pytest.raises(TypeError, match="object is not JSON serializable"):
        write_json_atomic(tmp_path / "r.json", {"x": object()})
    with pytest.raises(TypeError, match="ndarray"):  # an array is not a scalar: its caller converts it
        write_json_atomic(tmp_path / "r.json", {"x": np.zeros(2)})
    assert not (tmp_path / "r.json").exists()
