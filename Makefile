# Two commands on a fresh machine:  make demo   and   make test
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
MXVENV := .venv-mxnet

.PHONY: venv demo test test-core test-mxnet bench clean

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -e '.[torch,tensorflow,test]'
	touch $@

demo: venv
	$(VENV)/bin/bpslaunch --standalone --num-workers 2 --num-servers 2 \
		$(PY) examples/torch/train_digits.py

test: venv
	$(PY) -m pytest -q tests
	$(MAKE) test-mxnet

test-core: venv
	$(PY) -m pytest -q tests --ignore-glob='tests/test_tensorflow*' --ignore-glob='tests/test_keras*'

# MXNet 1.9.1 needs numpy<1.24: it lives in its own virtual environment.
test-mxnet: $(MXVENV)/.installed
	$(MXVENV)/bin/python -m pytest -q tests/test_mxnet*.py

$(MXVENV)/.installed: requirements-mxnet.txt pyproject.toml
	$(PYTHON) -m venv $(MXVENV)
	$(MXVENV)/bin/python -m pip install -q -r requirements-mxnet.txt
	$(MXVENV)/bin/python -m pip install -q --no-deps -e .
	$(MXVENV)/bin/python -c "import byteps.mxnet, sklearn; print('mxnet', byteps.mxnet.mx.__version__)"
	touch $@

bench: venv
	$(PY) benchmarks/push_pull.py

clean:
	rm -rf $(VENV) $(MXVENV) build *.egg-info
