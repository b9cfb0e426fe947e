# fusebox-server for GPU nodes. Build stage: CUDA toolkit + the C++ dependencies
# from the distribution's packages; runtime stage: CUDA runtime + cuBLAS and the
# server with the libraries it links (bundled as tools/gpu/device_bundle.sh does).
#   docker build -t fusebox .
#   docker run --gpus all -p 50051:50051 -p 9464:9464 fusebox
# Without a GPU the same image serves on the CPU (--backend=auto).
ARG CUDA_VERSION=13.0.0
FROM nvidia/cuda:${CUDA_VERSION}-devel-ubuntu24.04 AS build
RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      build-essential cmake file libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev \
      protobuf-compiler libssl-dev prometheus-cpp-dev libabsl-dev libgtest-dev libgmock-dev libopenblas-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DFUSEBOX_TESTS=OFF -DFUSEBOX_BENCH=OFF -DFUSEBOX_CUDA=ON \
    && cmake --build build -j"$(nproc)" --target fusebox-server fusebox_cuda_backend fusebox \
    && BUNDLE_GZIP=0 tools/gpu/device_bundle.sh build/server/fusebox-server build/server/libfusebox_cuda_backend.so \
       build/client/fusebox \
    && mkdir -p /opt/fusebox && cp -r .bundle/bin .bundle/lib /opt/fusebox/

FROM nvidia/cuda:${CUDA_VERSION}-runtime-ubuntu24.04
COPY --from=build /opt/fusebox /opt/fusebox
ENV LD_LIBRARY_PATH=/opt/fusebox/lib:/usr/local/cuda/lib64 PATH=/opt/fusebox/bin:$PATH
RUN useradd --system --uid 10001 fusebox
USER 10001
EXPOSE 50051 9464
ENTRYPOINT ["/opt/fusebox/bin/fusebox-server"]
CMD ["--address=0.0.0.0:50051", "--metrics_address=0.0.0.0:9464", "--backend=auto"]
