# rollgate: build with the toolchain, run on a slim Debian as a non-root user.
#   docker build -t ghcr.io/rollgate/rollgate:0.1.0 .
FROM rust:1-bookworm AS build
# etcd-client compiles etcd's protobuf definitions.
RUN apt-get update -q \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
       protobuf-compiler libprotobuf-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY Cargo.toml Cargo.lock build.rs ./
COPY src src
COPY scripts scripts
COPY benches benches
COPY tests tests
# The commit `rollgate --version` names (.git is not copied):
#   docker build --build-arg ROLLGATE_COMMIT=$(git rev-parse --short=12 HEAD) …
ARG ROLLGATE_COMMIT=unknown
RUN cargo build --release --locked --bin rollgate \
    && install -m 0755 target/release/rollgate /rollgate

FROM debian:bookworm-slim
# ssh: the node script runs over OpenSSH (control master); CA roots for HTTPS.
RUN apt-get update -q \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
       openssh-client ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --gid 65532 rollgate \
    && useradd --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin rollgate \
    && install -d -o 65532 -g 65532 -m 0750 /var/lib/rollgate
COPY --from=build /rollgate /usr/local/bin/rollgate
USER 65532:65532
ENV ROLLGATE__DATA_DIR=/var/lib/rollgate
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/rollgate"]
CMD ["serve"]
