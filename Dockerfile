# The byteps image for `bpslaunch k8s` (and any container runtime).
#
#   docker build -t byteps:cpu .                                   # CPU: servers, CPU workers
#   docker build -t byteps:cuda --build-arg VARIANT=cuda .         # CUDA workers
#   docker build -t byteps:cuda --build-arg VARIANT=cuda \
#       --build-arg BASE=nvidia/cuda:12.6.3-cudnn-runtime-ubuntu24.04 .
#
# One image serves every role: the scheduler and the servers need no GPU and no framework
# (run them from the CPU image on cheap CPU machines); the workers need the framework.
# EXTRAS picks the plugins installed (pip extras of pyproject.toml).
ARG VARIANT=cpu
ARG BASE=python:3.11-slim

FROM ${BASE}
ARG VARIANT
ARG EXTRAS=torch,examples
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# CUDA base images have no Python: install it; the slim Python image has it already.
RUN if ! command -v python3 >/dev/null; then \
        apt-get update && apt-get install -y --no-install-recommends python3 python3-venv \
        && rm -rf /var/lib/apt/lists/*; \
    fi \
    && python3 -m venv /opt/byteps
ENV PATH=/opt/byteps/bin:$PATH VIRTUAL_ENV=/opt/byteps
WORKDIR /workspace
COPY pyproject.toml constraints.txt README.md LICENSE MANIFEST.in /src/
COPY byteps /src/byteps
# cpu: the CPU build of torch (a few hundred MB instead of several GB of CUDA wheels)
RUN if [ "$VARIANT" = cpu ]; then \
        pip install --extra-index-url https://download.pytorch.org/whl/cpu "/src[$EXTRAS]"; \
    elif [ "$VARIANT" = cuda ]; then \
        pip install "/src[$EXTRAS]"; \
    else \
        echo "VARIANT must be cpu or cuda, not $VARIANT" >&2; exit 1; \
    fi \
    && bpslaunch --version
COPY examples /workspace/examples
# bpslaunch needs a command or DMLC_ROLE; the manifests of `bpslaunch k8s` give both.
ENTRYPOINT []
CMD ["bpslaunch", "--help"]
