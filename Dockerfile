# fusebox-server for GPU nodes. Build stage: CUDA toolkit + the C++ dependencies
# from the distribution's packages; runtime stage: CUDA runtime + cuBLAS and the
# server with the libraries it links (bundled as tools/gpu/device_bundle.sh does).
#   docker build --build-arg FUSEBOX_COMMIT=$(git rev-parse HEAD) -t fusebox:0.1.0 .
#   docker run --gpus all -p 50051:50051 -p 9464:9464 fusebox:0.1.0
# The tag is the version in CMakeLists.txt (scripts/validate_k8s.sh checks that this file and
# the manifests agree with it). Without a GPU the same image serves on the CPU
# (--backend=auto).
#
# GPU hosts need an NVIDIA driver of the 580 series or later: CUDA 13 runs on nothing older
# (the NVIDIA container runtime refuses to start the container otherwise, from the base
# image's NVIDIA_REQUIRE_CUDA), and Hopper (sm_90) GPUs, which the kernels are built for.
ARG CUDA_VERSION=13.0.0
FROM nvidia/cuda:${CUDA_VERSION}-devel-ubuntu24.04 AS build
# Versions unpinned (DL3008): Ubuntu's archive drops superseded versions, so pins break the
# build at the next security update; the base image's tag fixes the release.
# hadolint ignore=DL3008
RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      build-essential cmake file libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev \
      protobuf-compiler libssl-dev prometheus-cpp-dev libabsl-dev libgtest-dev libgmock-dev libopenblas-dev \
      libcli11-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DFUSEBOX_TESTS=OFF -DFUSEBOX_BENCH=OFF -DFUSEBOX_CUDA=ON \
    && cmake --build build -j"$(nproc)" --target fusebox-server fusebox_cuda_backend fusebox fusebox-perf \
    && BUNDLE_GZIP=0 tools/gpu/device_bundle.sh build/server/fusebox-server build/server/libfusebox_cuda_backend.so \
       build/client/fusebox build/client/fusebox-perf \
    && mkdir -p /opt/fusebox && cp -r .bundle/bin .bundle/lib /opt/fusebox/

FROM nvidia/cuda:${CUDA_VERSION}-runtime-ubuntu24.04
ARG FUSEBOX_VERSION=0.1.0
ARG FUSEBOX_COMMIT=unknown
LABEL org.opencontainers.image.title="fusebox" \
      org.opencontainers.image.description="GPU kernels (GeLU, softmax, row sum, matmul+ReLU) as a gRPC service; needs NVIDIA driver >= 580 (CUDA 13) on GPU hosts" \
      org.opencontainers.image.version="${FUSEBOX_VERSION}" \
      org.opencontainers.image.revision="${FUSEBOX_COMMIT}" \
      fusebox.nvidia-driver.minimum="580"
COPY --from=build /opt/fusebox /opt/fusebox
ENV LD_LIBRARY_PATH=/opt/fusebox/lib:/usr/local/cuda/lib64 PATH=/opt/fusebox/bin:$PATH
RUN useradd --system --uid 10001 fusebox
USER 10001
EXPOSE 50051 9464
# Docker's own check (Kubernetes uses the manifests' probes instead): the health service must
# say SERVING. With TLS on, set FUSEBOX_TLS_CA (and a certificate naming localhost).
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=3 \
  CMD ["fusebox", "--server=localhost:50051", "health"]
ENTRYPOINT ["/opt/fusebox/bin/fusebox-server"]
CMD ["--address=0.0.0.0:50051", "--metrics_address=0.0.0.0:9464", "--backend=auto"]
