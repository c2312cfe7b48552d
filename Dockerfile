# node-health-agent image: the agent (`run`) and the kmsg relay (`kmsg-relay`) share it; the
# built-in rule packs ship inside the installed package. Released images are built for linux/amd64
# and linux/arm64 by .github/workflows/image.yaml on every version tag (docs/deploy.md, "Get the
# image"); to build one yourself:
#
#   docker build -t <registry>/node-health-agent:0.1.0 .
#   docker buildx build --platform linux/amd64,linux/arm64 -t <registry>/node-health-agent:0.1.0 --push .
#
# The base is pinned by tag; for reproducible builds pin it by digest as well
# (FROM python:3.11.11-slim-bookworm@sha256:<digest>, from `docker buildx imagetools inspect`).
FROM python:3.11.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# journalctl, for node-problem-detector journald monitors (plugin: journald; the agent runs
# `journalctl --follow --output=json`). Debian ships it only in the systemd package: about 17 MB
# unpacked by Debian's Installed-Size figures (systemd 9.7 MB, libsystemd-shared 5.4 MB, and about
# 2 MB of libraries the slim base lacks: cryptsetup, devmapper, fdisk, kmod, apparmor, ip4tc); an
# estimate from package metadata, not a measured image. Nothing of systemd runs: the entrypoint is
# the agent. Versions come from the pinned base's Debian release (bookworm); pinning each package
# version would break the build at every Debian point release, hence DL3008 is ignored here.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends systemd \
    && journalctl --version \
    && rm -rf /var/lib/apt/lists/*

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
