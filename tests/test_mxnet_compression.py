"""MXNet: 2 workers train the digits MLP with every compressor through
DistributedTrainer(compression_params=...) (runs in .venv-mxnet; see
test_compression_train.py for the other plugins)."""
import pytest

pytest.importorskip("mxnet")

from test_compression_train import check_training  # noqa: E402

pytestmark = pytest.mark.timeout(400)


def test_compressed_training_mxnet(tmp_path):
    check_training(tmp_path, "mxnet")
