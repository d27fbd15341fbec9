# syntax=docker/dockerfile:1
# The protobot image: one static (musl) binary on distroless/static, non-root.
# `make image` builds it and tags it as the chart's default image
# (charts/protobot/values.yaml image.repository, tag = the chart's appVersion).
# docs/image.md: building, loading into kind / containerd, what is inside.

# --- build: a static x86_64 musl binary -------------------------------------
FROM docker.io/library/rust:1.95.0-bookworm AS build
# musl-tools: the C parts (vendored libgit2, libssh2, OpenSSL, zlib, SQLite, ring) are
# compiled with musl-gcc; perl and make build the vendored OpenSSL.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends musl-tools perl make \
 && rm -rf /var/lib/apt/lists/* \
 && rustup target add x86_64-unknown-linux-musl
WORKDIR /src
COPY . .
# --locked: the image is built from Cargo.lock, exactly as CI tests it.
RUN cargo build --locked --release --target x86_64-unknown-linux-musl -p protobot-cli --bin protobot \
 && install -D -m 0755 target/x86_64-unknown-linux-musl/release/protobot /out/protobot \
 && /out/protobot --version

# --- runtime ------------------------------------------------------------------
# distroless/static: CA certificates (HTTPS repositories), /etc/passwd with `nonroot`
# (65532, the uid the chart runs as), tzdata; no shell, no package manager.
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/protobot /usr/local/bin/protobot
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/protobot"]
CMD ["operator"]
