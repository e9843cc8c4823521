# The KRATOS image: one image, two entry points (`kratos-admit webhook`, `kratos-admit controller`).
# Multi-stage: wheels are built with the toolchain, the runtime stage has none of it.
# Runs as a non-root user and needs no writable root filesystem (Python writes no bytecode).
FROM python:3.12-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY kratos_admit ./kratos_admit
COPY profiler-controller ./profiler-controller
COPY runner/kratos_runner ./runner/kratos_runner
RUN python -m pip install --no-cache-dir --upgrade pip \
 && python -m pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.12-slim
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1
COPY --from=build /wheels /wheels
RUN python -m pip install --no-compile /wheels/*.whl \
 && rm -rf /wheels \
 && useradd --uid 65532 --no-create-home --shell /usr/sbin/nologin kratos
USER 65532:65532
EXPOSE 8443 9090
ENTRYPOINT ["kratos-admit"]
CMD ["webhook", "--config", "/etc/kratos/config/config.yaml"]
