# modelstate-server and modelstatectl in one image.
#
#   docker build -t modelstate .
#   docker run -p 127.0.0.1:50051:50051 -v modelstate-data:/data \
#     -v $PWD/tokens.json:/etc/modelstate/tokens.json:ro modelstate
#
# Production passes TLS flags instead of the default --plaintext (see CMD
# below and README, Deploy).

# ---------------------------------------------------------------- build --
FROM debian:bookworm-slim AS build
WORKDIR /src
# The packages and the build go through deploy/build.sh, which sources
# deploy/common.sh like deploy/test.sh (CI) does: the image is built from the
# package list and cmake steps that CI tests, not from a second copy of them.
# The scripts come first so that the package layer survives source edits.
COPY deploy/common.sh deploy/build.sh deploy/
RUN deploy/build.sh --packages-only
COPY . /src
RUN deploy/build.sh /build

# -------------------------------------------------------------- runtime --
FROM debian:bookworm-slim
# Only the shared libraries the two binaries load (libgrpc++1.51 pulls in
# libgrpc29, re2, c-ares and zlib; libcpp-httplib0.11 serves /metrics;
# libsqlite3-0 keeps the audit index); no
# compiler and no headers. OpenBLAS
# matches libopenblas-dev in the build packages. ca-certificates lets
# modelstatectl verify a server certificate signed by a public CA.
RUN apt-get update \
  && apt-get install -y --no-install-recommends \
       libgrpc++1.51 libprotobuf32 libabsl20220623 libssl3 \
       libopenblas0-pthread libcpp-httplib0.11 libsqlite3-0 ca-certificates \
  && rm -rf /var/lib/apt/lists/*

COPY --from=build /build/server/modelstate-server /usr/local/bin/modelstate-server
COPY --from=build /build/client/modelstatectl /usr/local/bin/modelstatectl

# A fixed numeric uid, so that Kubernetes' runAsUser/fsGroup and host volume
# ownership can name it. /data is created and owned here, before VOLUME, so
# that a fresh named volume starts out writable by that user.
RUN groupadd --gid 10001 modelstate \
  && useradd --uid 10001 --gid 10001 --no-create-home \
       --home-dir /nonexistent --shell /usr/sbin/nologin modelstate \
  && mkdir /data && chown 10001:10001 /data
VOLUME /data
EXPOSE 50051
USER 10001

# Docker's own health check (Kubernetes ignores it and uses the gRPC probes in
# deploy/k8s). It asks grpc.health.v1 on MODELSTATE_HEALTH_ADDR. With TLS on
# 50051, also pass --health_listen=127.0.0.1:50052 and set
# MODELSTATE_HEALTH_ADDR=127.0.0.1:50052: that listener is plaintext and
# serves only health, so the check needs no certificate or token.
ENV MODELSTATE_HEALTH_ADDR=127.0.0.1:50051
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=3 \
  CMD modelstatectl --server "$MODELSTATE_HEALTH_ADDR" --timeout 3 health

# The address and data directory are fixed; everything else comes as
# arguments (later flags win, so arguments may override these two too).
ENTRYPOINT ["/usr/local/bin/modelstate-server", "--listen=0.0.0.0:50051", "--data_dir=/data"]
# On a non-loopback address the server wants a token file (no anonymous
# admins on the network) and TLS, unless --plaintext allows going without.
# The default is plaintext with a token file mounted at
# /etc/modelstate/tokens.json: good for a trusted network or behind
# -p 127.0.0.1:...; tokens then cross the wire in clear. Production replaces
# these arguments with --tls_cert_file, --tls_key_file, --tls_client_ca_file
# and --token_file (deploy/k8s/configmap.yaml does).
CMD ["--plaintext", "--token_file=/etc/modelstate/tokens.json"]
