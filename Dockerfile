# Multi-stage build: a static binary in a distroless image.
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY benches ./benches
RUN cargo build --release --locked --bin kube-watchcache

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /src/target/release/kube-watchcache /usr/local/bin/kube-watchcache
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/kube-watchcache"]
CMD ["serve", "--help"]
