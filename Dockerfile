# syntax=docker/dockerfile:1
# HAPTIC images. Targets (docker build --target NAME):
#   controller  static haptic + static haproxy (for haproxy -c), FROM scratch
#   agent       static haptic-agent + static haproxy (for haproxy -c), FROM scratch
#   haproxy     the same static haproxy alone, FROM scratch (optional HAProxy container image)
#
#   docker build --target controller -t registry.example.com/haptic-controller:0.1.0 .
#   docker build --target agent      -t registry.example.com/haptic-agent:0.1.0 .
#
# Build arguments: HAPROXY_VERSION (keep its major.minor equal to the chart's haproxy.image.tag),
# HAPROXY_SHA256 (checked when set), VERSION (image label), RUST_IMAGE, ALPINE_IMAGE (mirrors),
# DIST (where the final stages take their files from, below).
# Everything is fetched at build time only; the images fetch nothing at run time.
#
# The final stages copy their files from the stage `dist`, which is one of:
#   dist-source  (default) builds haproxy, haptic and haptic-agent in the stages below;
#   dist-local   takes them from the build context's dist/ directory, as prepared by
#                scripts/build-images.sh, which builds them on the machine itself (offline, with
#                buildah): `--build-arg DIST=dist-local`. Unused stages are skipped.

ARG RUST_IMAGE=docker.io/library/rust:1.95-bookworm
ARG ALPINE_IMAGE=docker.io/library/alpine:3.22
ARG DIST=dist-source

# --- static HAProxy, built against musl, OpenSSL, PCRE2, zlib and Lua 5.4 from Alpine's static
# libraries (Lua: the Gateway library's RequestMirror loads a Lua action; the controller's
# haproxy -c must accept lua-load)
FROM ${ALPINE_IMAGE} AS haproxy-build
ARG HAPROXY_VERSION=3.2.4
ARG HAPROXY_SHA256=
RUN apk add --no-cache build-base linux-headers file curl \
        openssl-dev openssl-libs-static pcre2-dev zlib-dev zlib-static lua5.4-dev
WORKDIR /src
RUN curl -fsSLo haproxy.tar.gz "https://www.haproxy.org/download/${HAPROXY_VERSION%.*}/src/haproxy-${HAPROXY_VERSION}.tar.gz" \
    && if [ -n "$HAPROXY_SHA256" ]; then echo "$HAPROXY_SHA256  haproxy.tar.gz" | sha256sum -c -; fi \
    && tar xzf haproxy.tar.gz --strip-components=1 \
    && rm haproxy.tar.gz
RUN make -j"$(nproc)" TARGET=linux-musl \
        USE_OPENSSL=1 USE_PCRE2=1 USE_PCRE2_JIT=1 USE_ZLIB=1 USE_PROMEX=1 USE_DL= \
        USE_LUA=1 LUA_INC=/usr/include/lua5.4 LUA_LIB=/usr/lib/lua5.4 \
        LDFLAGS="-static -s" \
    && ./haproxy -vv && ./haproxy -vv | grep -q "Built with Lua version" \
    && file haproxy | grep -q "statically linked" \
    && mkdir -p /out/skel/tmp && chmod 1777 /out/skel/tmp \
    && install -m 0755 haproxy /out/haproxy

# --- static haptic and haptic-agent (x86_64-unknown-linux-musl), with the repository's script
FROM ${RUST_IMAGE} AS rust-build
RUN apt-get update -qq && apt-get install -y -qq --no-install-recommends musl-tools file \
    && rm -rf /var/lib/apt/lists/* \
    && rustup target add x86_64-unknown-linux-musl
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    scripts/build-static.sh /out \
    && file /out/haptic /out/haptic-agent | grep -c "static" | grep -qx 2

# --- the files of the final stages: /haptic, /haptic-agent, /haproxy, and /skel/ with the
# directories every image has (tmp, mode 1777: COPY keeps the mode of directories it copies, not
# of the directory it creates as destination)
FROM scratch AS dist-source
COPY --from=rust-build /out/haptic /out/haptic-agent /
COPY --from=haproxy-build /out/haproxy /haproxy
COPY --from=haproxy-build /out/skel/ /skel/

FROM scratch AS dist-local
COPY dist/ /

FROM ${DIST} AS dist

# --- controller
FROM scratch AS controller
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="haptic-controller" \
      org.opencontainers.image.description="HAPTIC controller: renders, validates (haproxy -c) and deploys HAProxy configuration" \
      org.opencontainers.image.source="https://github.com/haproxy-haptic/haptic" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=dist /haptic /usr/local/bin/haptic
COPY --from=dist /haproxy /usr/local/sbin/haproxy
# haproxy -c works in a temporary directory; Kubernetes mounts an emptyDir here.
COPY --from=dist /skel/ /
USER 65532:65532
ENV HAPROXY_BIN=/usr/local/sbin/haproxy
EXPOSE 8080 9090 9443
ENTRYPOINT ["/usr/local/bin/haptic"]
CMD ["run"]

# --- agent
FROM scratch AS agent
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="haptic-agent" \
      org.opencontainers.image.description="HAPTIC agent: applies configuration bundles to the HAProxy beside it" \
      org.opencontainers.image.source="https://github.com/haproxy-haptic/haptic" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=dist /haptic-agent /usr/local/bin/haptic-agent
COPY --from=dist /haproxy /usr/local/sbin/haproxy
COPY --from=dist /skel/ /
USER 65532:65532
EXPOSE 5555 5556
ENTRYPOINT ["/usr/local/bin/haptic-agent"]

# --- optional HAProxy image with the same static binary
FROM scratch AS haproxy
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="haptic-haproxy" \
      org.opencontainers.image.description="Static HAProxy for HAPTIC HAProxy pods" \
      org.opencontainers.image.source="https://github.com/haproxy-haptic/haptic" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="GPL-2.0-or-later"
COPY --from=dist /haproxy /usr/local/sbin/haproxy
COPY --from=dist /skel/ /
USER 65532:65532
# SIGTERM stops HAProxy at once, cutting connections in flight; SIGUSR1 is its soft stop
# (listeners close, connections finish, bounded by hard-stop-after). The kubelet sends this.
STOPSIGNAL SIGUSR1
ENTRYPOINT ["/usr/local/sbin/haproxy"]
