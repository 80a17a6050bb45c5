# The one Trellis runtime image: every binary (trellis-operator, -scheduler, -agent, -pserver,
# -launch, trellis-mlp, ...), libtrellis (static library + public headers) and the Python binding, on Debian 12 packages only.
# Referenced by charts/trellis/values.yaml (image.repository/tag) and manifests/.
#   docker build -t ghcr.io/trellis-ml/trellis:0.1.0 .
# (Not built in CI here: no Docker engine. Package names are checked against Debian 12.)

FROM debian:12-slim AS build
ENV DEBIAN_FRONTEND=noninteractive
RUN apt-get update -q && apt-get install -y -q --no-install-recommends \
      build-essential cmake pkg-config ca-certificates \
      libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler \
      libyaml-cpp-dev prometheus-cpp-dev libssl-dev libcpprest-dev \
      python3-dev pybind11-dev python3-numpy \
    && rm -rf /var/lib/apt/lists/*
COPY . /src
WORKDIR /src
RUN cmake -S . -B /build -DCMAKE_BUILD_TYPE=Release -DTRELLIS_BUILD_TESTS=OFF -DTRELLIS_BUILD_BENCH=OFF \
 && cmake --build /build -j"$(nproc)" \
 && mkdir -p /out/usr/local/bin /out/usr/local/lib /out/usr/share/trellis/examples \
 && cp -a /build/bin/. /out/usr/local/bin/ \
 && find /build -name 'libtrellis*.a' -exec cp -a {} /out/usr/local/lib/ \; \
 && mkdir -p /out/usr/local/include && cp -a worker-lib/include/trellis /out/usr/local/include/ \
 && cmake --install /build --component python --prefix /out/usr \
 && cp -a examples/pytorch examples/jobs examples/mlp.yaml /out/usr/share/trellis/examples/

FROM debian:12-slim
ENV DEBIAN_FRONTEND=noninteractive
# Runtime libraries of the build stage's -dev packages; python3-torch for PyTorch jobs.
RUN apt-get update -q && apt-get install -y -q --no-install-recommends \
      ca-certificates libgrpc++1.51 libprotobuf32 libyaml-cpp0.7 \
      libprometheus-cpp-core1.0 libprometheus-cpp-pull1.0 libcpprest2.10 libssl3 \
      python3 python3-numpy python3-torch \
    && rm -rf /var/lib/apt/lists/* \
    && ldconfig
COPY --from=build /out/ /
RUN ldconfig && useradd --uid 65532 --no-create-home --shell /usr/sbin/nologin trellis
# The operator runs as this user (the chart sets runAsUser 65532); job pods may override.
USER 65532
# No ENTRYPOINT: the operator Deployment runs trellis-operator, job pods trellis-agent or
# trellis-scheduler (commands set by the operator).
CMD ["trellis-operator", "--help"]
