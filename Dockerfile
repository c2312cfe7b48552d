# node-health-agent image: the agent (`run`) and the kmsg relay (`kmsg-relay`) share it; the
# built-in rule packs ship inside the installed package.
#
#   docker build -t <registry>/node-health-agent:0.1.0 .
#
# The base is pinned by tag; for reproducible builds pin it by digest as well
# (FROM python:3.11.11-slim-bookworm@sha256:<digest>, from `docker buildx imagetools inspect`).
FROM python:3.11.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
COPY pyproject.toml README.md ./
COPY agent/ agent/
COPY plugins/ plugins/
RUN pip install --no-cache-dir .

# Run from / so that nothing is imported from the source tree; the installed package is used.
WORKDIR /

# Non-root by default (the numeric uid needs no passwd entry). The DaemonSet runs only the
# kmsg-relay container (privileged) and a one-shot chown init container as root.
USER 65532:65532

ENTRYPOINT ["node-health-agent"]
CMD ["run"]
