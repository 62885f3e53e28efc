# The kernelloop service on an NVIDIA GPU host: `docker compose up -d` (see docker-compose.yml).
#
# A CUDA *devel* image, because submissions are built with nvcc (torch.utils.cpp_extension.load_inline);
# bubblewrap for the sandbox. The service runs as an unprivileged user; its database, build cache and
# registered problems live on the volume at /var/lib/kernelloop.
ARG CUDA_IMAGE=nvidia/cuda:13.0.1-devel-ubuntu24.04
FROM ${CUDA_IMAGE}

ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PATH=/opt/kernelloop/venv/bin:${PATH}

RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv python3-dev g++ ninja-build bubblewrap ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && python3 -m venv /opt/kernelloop/venv \
 && pip install --upgrade pip

# torch first: the largest layer, kept when only kernelloop's code changes (torch 2.14.1 is built for CUDA 13.0)
ARG TORCH_VERSION=2.14.1
RUN pip install "torch==${TORCH_VERSION}"

WORKDIR /opt/kernelloop/src
COPY . .
# with Ray and PostgreSQL's driver: one image for the service, a Ray head and Ray workers (docker-compose.yml)
RUN pip install ".[ray,postgres]" \
 && useradd --create-home --uid 1000 kernelloop \
 && mkdir -p /var/lib/kernelloop/data /var/lib/kernelloop/problems \
 && chown -R kernelloop:kernelloop /var/lib/kernelloop

# data: database (SQLite, WAL), build cache and job folders; the sandbox hides it from submitted code.
# problems: registered problem files, which sandboxed workers import, so outside data.
ENV KERNELLOOP_DATA_DIR=/var/lib/kernelloop/data \
    KERNELLOOP_PROBLEMS_DIR=/var/lib/kernelloop/problems \
    KERNELLOOP_HOST=0.0.0.0 \
    KERNELLOOP_PORT=8000

USER kernelloop
WORKDIR /var/lib/kernelloop
EXPOSE 8000
VOLUME ["/var/lib/kernelloop"]
HEALTHCHECK --interval=30s --timeout=10s --start-period=60s \
  CMD python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/v1/health', timeout=5)"
# Listening on 0.0.0.0 needs KERNELLOOP_API_TOKEN: without one, `kernelloop serve` refuses to start.
CMD ["kernelloop", "serve"]
