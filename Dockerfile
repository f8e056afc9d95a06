# syntax=docker/dockerfile:1
# The ext_proc gRPC server (`extproc serve`) as a small, non-root image.
#
#   docker build -t embeddings-contract-gateway/extproc:0.1.0 .
#   docker run --rm -p 50051:50051 -p 9090:9090 \
#     -v "$HOME/.cache/huggingface:/models:ro" embeddings-contract-gateway/extproc:0.1.0
#
# Tokenizers come from a Hugging Face cache mounted at /models (HF_HOME), offline by
# default: the image never downloads anything at run time. Mount the cache your model
# server already filled (docker-compose.yml shares one volume), or point a model at a
# plain directory holding tokenizer.json with EXTPROC_TOKENIZER_OVERRIDES=NAME=DIR.
# Policy: the shipped Qwen3-Embedding-0.6B file unless EXTPROC_CONFIG (or --config)
# names another, e.g. a mounted /etc/extproc/policy.yaml.
# Checked in CI by hadolint (tests/test_deploy_artifacts.py); see docs/deploy.md.

FROM python:3.11.14-slim-bookworm AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN python -m venv /opt/extproc
WORKDIR /src
# Only what `pip install .` reads: the project metadata (pyproject.toml, README.md as
# its readme), the package with its data (policies, presets, generated protos) and the
# Envoy configs it ships (extproc/envoy_templates links to envoy/).
COPY pyproject.toml README.md ./
COPY extproc ./extproc
COPY envoy/*.yaml ./envoy/
# Install from the project's own pyproject.toml with a pinned pip, with the tracing
# extra only (`extproc serve --tracing` joins the mesh's traces): `extproc serve`
# never starts Envoy, so the Envoy binary of the `run` extra stays out; the Envoy
# protos the server imports come from xds-protos. xds-protos also ships an older copy
# of opentelemetry-proto's modules under the same names, and whichever pip writes last
# wins: opentelemetry-proto is written again so the OTLP exporter gets its own. The
# import check fails the build if either ever stops being true.
RUN /opt/extproc/bin/pip install --no-cache-dir pip==26.3 \
 && /opt/extproc/bin/pip install --no-cache-dir '.[tracing]' \
 && /opt/extproc/bin/pip install --no-cache-dir --force-reinstall --no-deps \
      "opentelemetry-proto==$(/opt/extproc/bin/python -c 'import importlib.metadata as m; print(m.version("opentelemetry-proto"))')" \
 && /opt/extproc/bin/python -c "import extproc.service.server, extproc.service.tracing, envoy.service.ext_proc.v3.external_processor_pb2_grpc"

FROM python:3.11.14-slim-bookworm
RUN groupadd --system --gid 10001 extproc \
 && useradd --system --uid 10001 --gid extproc --no-create-home \
      --home-dir /nonexistent --shell /usr/sbin/nologin extproc
COPY --from=build /opt/extproc /opt/extproc
ENV PATH=/opt/extproc/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HF_HOME=/models \
    HF_HUB_OFFLINE=1 \
    EXTPROC_LISTEN=0.0.0.0:50051 \
    EXTPROC_METRICS=0.0.0.0:9090
USER 10001:10001
WORKDIR /nonexistent
# 50051: gRPC (ext_proc + grpc.health.v1); 9090: Prometheus /metrics.
EXPOSE 50051 9090
# Asks the server's own gRPC health service: SERVING once policy and tokenizers are
# loaded, NOT_SERVING while it drains after SIGTERM.
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=3 \
  CMD ["extproc", "health", "--address", "127.0.0.1:50051", "--timeout", "3"]
ENTRYPOINT ["extproc"]
# --grace: in-flight streams get 30 s after SIGTERM; give `docker stop` more
# (docker-compose.yml sets stop_grace_period: 40s).
CMD ["serve", "--grace", "30"]
