# The policy server (scripts/serve.py) in a container. CPU by default:
#   docker build -t oxygen-jax .
# CUDA 12 (jaxlib with its CUDA libraries from pip; the host needs the NVIDIA driver and container toolkit):
#   docker build --build-arg EXTRAS=gcs,cuda12 -t oxygen-jax:cuda .
# Run it with openpi's cache mounted (checkpoints, the PaliGemma tokenizer; gs:// URLs download into it):
#   docker run --rm -p 8000:8000 -v ~/.cache/openpi:/openpi-cache oxygen-jax \
#     --env=libero --checkpoint_dir=gs://openpi-assets/checkpoints/pi05_libero
#   docker run --rm --gpus all -p 8000:8000 -v ~/.cache/openpi:/openpi-cache oxygen-jax:cuda --env=droid ...
ARG PYTHON_VERSION=3.11
FROM python:${PYTHON_VERSION}-slim

# Extras from pyproject.toml: gcs (gs:// checkpoints), cuda12 (GPU jaxlib).
ARG EXTRAS=gcs
ENV PIP_NO_CACHE_DIR=1 \
    PYTHONUNBUFFERED=1 \
    OPENPI_DATA_HOME=/openpi-cache

WORKDIR /app
COPY pyproject.toml README.md LICENSE constraints.txt ./
COPY src ./src
COPY scripts ./scripts
# The constraints file pins every package it lists to the tested version.
RUN pip install -c constraints.txt ".[${EXTRAS}]"

VOLUME /openpi-cache
EXPOSE 8000
ENTRYPOINT ["python", "scripts/serve.py", "--host=0.0.0.0", "--port=8000"]
CMD ["--env=libero"]
