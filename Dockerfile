# The policy server (oxygen-serve) in a container. CPU by default:
#   docker build -t oxygen-jax .
#   docker run --rm -p 8000:8000 oxygen-jax       # serves the shipped demo model, pi05_demo; nothing to mount
# CUDA 12 (jaxlib with its CUDA libraries from pip; the host needs the NVIDIA driver and container toolkit):
#   docker build --build-arg EXTRAS=gcs,cuda12 -t oxygen-jax:cuda .
# An openpi checkpoint, with openpi's cache mounted (checkpoints, the PaliGemma tokenizer; gs:// URLs
# download into it). Arguments replace the default ones (the host and port stay):
#   docker run --rm -p 8000:8000 -v ~/.cache/openpi:/openpi-cache oxygen-jax \
#     --env=libero --checkpoint_dir=gs://openpi-assets/checkpoints/pi05_libero
#   docker run --rm --gpus all -p 8000:8000 -v ~/.cache/openpi:/openpi-cache oxygen-jax:cuda --env=droid ...
# The server runs as the unprivileged user `oxygen` (uid 1000); a mounted cache must be writable by it
# (or add `--user "$(id -u):$(id -g)"`).
ARG PYTHON_VERSION=3.11
FROM python:${PYTHON_VERSION}-slim

# Extras from pyproject.toml: gcs (gs:// checkpoints), cuda12 or cuda13 (GPU jaxlib).
ARG EXTRAS=gcs
ENV PIP_NO_CACHE_DIR=1 \
    PYTHONUNBUFFERED=1 \
    OPENPI_DATA_HOME=/openpi-cache

WORKDIR /app
COPY pyproject.toml README.md LICENSE constraints.txt ./
COPY src ./src
# The constraints file pins every package it lists to the tested version.
RUN pip install -c constraints.txt ".[${EXTRAS}]" \
    && useradd --create-home --uid 1000 oxygen \
    && mkdir -p /openpi-cache \
    && chown oxygen /openpi-cache

USER oxygen
VOLUME /openpi-cache
EXPOSE 8000
# Ready once the model is loaded and every shape compiled (the first start takes a while: start period).
HEALTHCHECK --interval=30s --timeout=5s --start-period=600s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/readyz', timeout=4)"]
ENTRYPOINT ["oxygen-serve", "--host=0.0.0.0", "--port=8000"]
CMD ["--config=pi05_demo", "--max_text_tokens=12"]
