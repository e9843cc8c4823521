# The KRATOS image: one image, two entry points (`kratos-admit webhook`, `kratos-admit controller`).
# Multi-stage: the build stage installs KRATOS and its dependencies into a virtual environment, and the
# runtime stage copies that environment alone. Runs as a non-root user (65532) and needs no writable
# root filesystem (Python writes no bytecode).
#
# PYTHON_IMAGE: any Debian-like image with Python 3.11+ and its venv module, the same for both stages
# (the environment's python links to the base's). The default is the registry's python:3.12-slim; where
# no registry is reachable, a local Debian 12 image with python3 and python3-venv does
# (docs/install.md, "Building the images"). A virtual environment makes a distribution's "externally
# managed" Python (PEP 668) no obstacle.
ARG PYTHON_IMAGE=python:3.12-slim

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python3 -m venv /opt/kratos/venv
WORKDIR /src
COPY pyproject.toml README.md ./
COPY kratos_admit ./kratos_admit
COPY profiler-controller ./profiler-controller
COPY runner/kratos_runner ./runner/kratos_runner
RUN /opt/kratos/venv/bin/pip install --no-compile .

FROM ${PYTHON_IMAGE}
ENV PATH=/opt/kratos/venv/bin:${PATH} \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
COPY --from=build /opt/kratos/venv /opt/kratos/venv
# the numeric user of the Deployments' runAsUser; no home, no login shell
RUN useradd --uid 65532 --no-create-home --shell /usr/sbin/nologin kratos \
 && kratos-admit --help > /dev/null
USER 65532:65532
EXPOSE 8443 9090
ENTRYPOINT ["kratos-admit"]
CMD ["webhook", "--config", "/etc/kratos/config/config.yaml"]
