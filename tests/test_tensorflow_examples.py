"""The TensorFlow and Keras digits examples reach >= 0.95 test accuracy with 2 workers."""
import importlib.util
import re
import sys

import pytest
from conftest import ROOT, assert_ok, run_job

# find_spec, not import: TensorFlow loads only in the worker processes
if importlib.util.find_spec("tensorflow") is None:
    pytest.skip("tensorflow is not installed (pip install -e '.[tensorflow]')",
                allow_module_level=True)


@pytest.mark.timeout(400)
@pytest.mark.parametrize("example", ["tensorflow/train_digits_tape.py",
                                     "keras/train_digits_fit.py"])
def test_digits_example(example):
    res = run_job([sys.executable, str(ROOT / "examples" / example)], workers=2, servers=2,
                  timeout=240)
    assert_ok(res)
    accs = [float(a) for a in re.findall(r"test_acc=([0-9.]+)", res.stdout)]
    assert accs, res.stdout
    assert accs[-1] >= 0.95, res.stdout
