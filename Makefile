# Two commands on a fresh machine:  make demo   and   make test
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# exact versions of the tested set (pyproject.toml has lower bounds only)
PIP := $(PY) -m pip install -q --no-compile -c constraints.txt
# pip byte-compiles what it installs on one core; compileall -j 0 uses every core.  Python
# reads these .pyc files even where PYTHONDONTWRITEBYTECODE keeps it from writing them, so
# every process of every job skips compiling the frameworks and byteps itself.  A file that
# fails to compile (a package's own test data) is left as pip leaves it.
COMPILE = $(1) -m compileall -q -j 0 $(2) >/dev/null 2>&1 || true
SITE = $$($(1) -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
# MXNet 1.9.1 needs numpy<1.24, which has wheels for Python <= 3.11 only
MXPYTHON ?= $(PYTHON)
MXVENV := .venv-mxnet

.PHONY: venv demo test test-core test-mxnet mxnet-tests bench clean

$(PY):
	$(PYTHON) -m venv $(VENV)

# the demo needs PyTorch and scikit-learn only (no TensorFlow)
$(VENV)/.demo: pyproject.toml constraints.txt | $(PY)
	$(PIP) -e '.[torch,examples]'
	$(call COMPILE,$(PY),$(call SITE,$(PY)) byteps examples)
	touch $@

# the tests need every plugin's framework (MXNet has its own environment, below)
$(VENV)/.installed: pyproject.toml constraints.txt | $(PY)
	$(PIP) -e '.[torch,tensorflow,tf-keras,examples,test]'
	$(call COMPILE,$(PY),$(call SITE,$(PY)))
	touch $@ $(VENV)/.demo

venv: $(VENV)/.installed

demo: $(VENV)/.demo
	$(VENV)/bin/bpslaunch --standalone --num-workers 2 --num-servers 2 \
		$(PY) examples/torch/train_digits.py

# Two streams share CI's two cores (the main suite keeps about one busy on average): the
# main suite, and alongside it the files of ALONGSIDE (TensorFlow's, whose every worker
# spends seconds importing it, the compressors' training runs, and the launchers' for
# Kubernetes and Slurm and the dashboard's) followed by MXNet's tests (their own venv);
# their output follows the suite's
PYTEST_ARGS ?= -q --durations=20 tests
ALONGSIDE ?= tests/test_tensorflow*.py tests/test_keras*.py tests/test_compose_tf.py \
	tests/test_compression_train.py tests/test_k8s*.py tests/test_slurm.py tests/test_dashboard.py
test: venv
	@$(call COMPILE,$(PY),byteps tests benchmarks examples)
	@{ if [ -n "$(strip $(ALONGSIDE))" ]; then $(PY) -m pytest -q $(ALONGSIDE); \
	   else true; fi; arc=$$?; $(MAKE) --no-print-directory test-mxnet; mrc=$$?; \
	   [ $$arc -eq 0 ] && [ $$mrc -eq 0 ]; } > .alongside-tests.log 2>&1 & al=$$!; \
	$(PY) -m pytest $(PYTEST_ARGS) $(foreach f,$(ALONGSIDE),--ignore-glob='$(f)'); rc=$$?; \
	wait $$al; arc=$$?; echo "== run alongside: $(ALONGSIDE), then make test-mxnet =="; \
	cat .alongside-tests.log; [ $$rc -eq 0 ] && [ $$arc -eq 0 ]

test-core: venv
	@$(call COMPILE,$(PY),byteps tests benchmarks examples)
	$(PY) -m pytest -q tests --ignore-glob='tests/test_tensorflow*' --ignore-glob='tests/test_keras*'

# MXNet lives in its own virtual environment; on Python 3.12+ it is skipped with a message.
test-mxnet:
	@if $(MXPYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 12))'; then \
		echo "SKIPPED the MXNet tests: MXNet 1.9.1 needs numpy<1.24, which has no wheel for" \
		     "Python $$($(MXPYTHON) -c 'import sys; print(*sys.version_info[:2], sep=".")');" \
		     "run them with a Python 3.10 or 3.11: make test-mxnet MXPYTHON=python3.11"; \
	else \
		$(MAKE) mxnet-tests; \
	fi

mxnet-tests: $(MXVENV)/.installed
	$(MXVENV)/bin/python -m pytest -q tests/test_mxnet*.py

$(MXVENV)/.installed: requirements-mxnet.txt pyproject.toml
	$(MXPYTHON) -m venv $(MXVENV)
	$(MXVENV)/bin/python -m pip install -q --no-compile -r requirements-mxnet.txt
	$(MXVENV)/bin/python -m pip install -q --no-compile --no-deps -e .
	$(call COMPILE,$(MXVENV)/bin/python,$(call SITE,$(MXVENV)/bin/python))
	$(MXVENV)/bin/python -c "import byteps.mxnet, sklearn; print('mxnet', byteps.mxnet.mx.__version__)"
	touch $@

bench: venv
	$(PY) benchmarks/push_pull.py

clean:
	rm -rf $(VENV) $(MXVENV) build dist *.egg-info
