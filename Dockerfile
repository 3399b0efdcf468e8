# kube-watchcache image: a static, stripped binary in distroless/static, running as non-root.
#
#   docker build -t kube-watchcache:dev .
#
# The build context is an allowlist (.dockerignore): Cargo.toml, Cargo.lock, src/, benches/, crates/,
# vendor/ (the patched h2 that Cargo.toml's [patch.crates-io] names).
#
# Base images are pinned by digest. Both digests were taken from public Dockerfiles and build
# logs that pinned these tags in 2026 (rust:1.95-bookworm, and distroless static-debian12:nonroot
# "as of 2026-08-26"); no registry is reachable from the machine this file was written on, so
# they are NOT verified here. Before a release, check and refresh them:
#   crane digest rust:1.95-bookworm
#   crane digest gcr.io/distroless/static-debian12:nonroot

FROM rust:1.95-bookworm@sha256:6258907abe69656e41cd992e0b705cdcfabcbbe3db374f92ed2d47121282d4a1 AS build
WORKDIR /src
# A fully static glibc binary (the crate uses rustls/ring, no OpenSSL). With --target, RUSTFLAGS
# apply to the target only, not to build scripts and proc-macros, which stay dynamic.
# Glibc >= 2.34 has the files and dns NSS modules built in, so name resolution (an --upstream
# with a host name) works without /etc/nsswitch.conf or NSS libraries in the final image.
ENV RUSTFLAGS="-C target-feature=+crt-static" \
    CARGO_PROFILE_RELEASE_STRIP=symbols \
    CARGO_PROFILE_RELEASE_DEBUG=false \
    CARGO_TERM_COLOR=never
# The Rust target: from buildx's TARGETARCH (amd64, arm64; this stage runs on the target's
# platform, emulated where it is not the builder's), or as given (`--build-arg TARGET=…`).
# Before 2026-11-29 it was x86_64 whatever the platform: an arm64 build made no arm64 binary.
ARG TARGETARCH
ARG TARGET=""
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
RUN t="$TARGET"; \
    if [ -z "$t" ]; then \
      case "${TARGETARCH:-amd64}" in \
        amd64) t=x86_64-unknown-linux-gnu ;; \
        arm64) t=aarch64-unknown-linux-gnu ;; \
        *) echo "unsupported TARGETARCH ${TARGETARCH}: give --build-arg TARGET=<rust target>" >&2; exit 1 ;; \
      esac; \
    fi; \
    echo "$t" > /rust-target

# Dependency layer: only the manifests and empty targets, so this layer (all dependencies
# compiled) is reused until a Cargo.toml or Cargo.lock changes. The workspace has four members
# (the core library with five [[bench]] targets, the binary, the sim and the harness); every
# target needs a file for the manifests to load.
#
# The binary is built without its default `tools` feature: the image is the proxy alone, and
# links neither the simulated apiserver nor the load harness (`sim`, `demo` and `bench` are not
# in it; `cargo run --release -- bench …` from a checkout has them).
COPY Cargo.toml Cargo.lock ./
# A dependency, patched (vendor/h2/PATCHES.md): compiled in this layer with the others.
COPY vendor ./vendor
COPY crates/cli/Cargo.toml crates/cli/
COPY crates/sim/Cargo.toml crates/sim/
COPY crates/bench/Cargo.toml crates/bench/
RUN mkdir -p src benches crates/cli/src crates/sim/src crates/bench/src \
    && echo 'fn main() {}' > crates/cli/src/main.rs \
    && touch src/lib.rs crates/sim/src/lib.rs crates/bench/src/lib.rs \
    && for b in objects list fanout history queues; do echo 'fn main() {}' > "benches/$b.rs"; done \
    && cargo build --release --locked --target "$(cat /rust-target)" -p kube-watchcache-cli --no-default-features \
    && cargo clean --release --target "$(cat /rust-target)" -p kube-watchcache -p kube-watchcache-cli \
    && rm -rf src benches crates

# The real sources (benches/ and the other members too: the manifests name their targets).
COPY src ./src
COPY benches ./benches
COPY crates ./crates
RUN cargo build --release --locked --target "$(cat /rust-target)" -p kube-watchcache-cli --no-default-features \
    && cp "target/$(cat /rust-target)/release/kube-watchcache" /kube-watchcache \
    && /kube-watchcache --version

FROM gcr.io/distroless/static-debian12:nonroot@sha256:afa5c872c891853ca7fcf1f12c3edb23f7eeef36189728842dd51042ff57f7ab
COPY --from=build /kube-watchcache /usr/local/bin/kube-watchcache
# distroless "nonroot": uid/gid 65532 (the Helm chart runs it with the same ids).
USER 65532:65532
EXPOSE 8443
ENTRYPOINT ["/usr/local/bin/kube-watchcache"]
CMD ["serve", "--help"]
