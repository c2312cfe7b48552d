# node-health-agent image: the agent (`run`) and the kmsg relay (`kmsg-relay`) share it; the
# built-in rule packs ship inside the installed package. Released images are built for linux/amd64
# and linux/arm64 by .github/workflows/image.yaml on every version tag (docs/deploy.md, "Get the
# image"); to build one yourself:
#
#   docker build -t <registry>/node-health-agent:0.1.0 .                           # the default image
#   docker build --target journald -t <registry>/node-health-agent:0.1.0-journald .  # + journalctl
#   docker buildx build --platform linux/amd64,linux/arm64 -t <registry>/node-health-agent:0.1.0 --push .
#
# Stages: `build` installs the package into a virtual environment and trims it; `agent` is the base
# plus that environment (the default image: the last stage is `agent` again); `journald` adds
# journalctl for node-problem-detector journald monitors (the kustomize component
# daemonset/components/journald selects it). How big each is, measured: `python bench/run.py image`.
#
# The base is pinned by tag; for reproducible builds pin it by digest as well
# (FROM python:3.11.11-slim-bookworm@sha256:<digest>, from `docker buildx imagetools inspect`).
FROM python:3.11.11-slim-bookworm AS build

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
COPY pyproject.toml README.md ./
COPY agent/ agent/
COPY plugins/ plugins/

# 1. The package and its dependencies, without bytecode (pip would compile every module it installs,
#    used or not), into an environment without pip of its own.
# 2. The kubernetes client's asyncio half (kubernetes/aio, 68 MB) and what only it needs (aiohttp and its
#    helpers): the agent calls the synchronous client only (agent/adapters/kube.py). pip's metadata still
#    lists aiohttp as a requirement of kubernetes; nothing imports it (the import check below proves it).
# 3. Bytecode for what the agent imports (its own package, and the SDK modules that the adapters load
#    when Kubernetes mode, AWS and the pod-resources lookup start), checked against nothing at run time
#    (unchecked-hash: the root file system is read-only, and COPY need not keep modification times).
#    `-I`: the installed package is imported, not /src's (isolated mode: no current directory on the path).
RUN python -m venv --without-pip /opt/node-health-agent \
    && pip --python /opt/node-health-agent/bin/python install --no-compile . \
    && pip --python /opt/node-health-agent/bin/python uninstall -y \
        aiohttp aiohttp-retry aiosignal aiohappyeyeballs frozenlist multidict yarl propcache \
    && rm -rf /opt/node-health-agent/lib/python3.11/site-packages/kubernetes/aio \
    && /opt/node-health-agent/bin/python -I -c "\
import importlib, pkgutil, py_compile, sys; \
import agent; \
own = [m.name for m in pkgutil.walk_packages(agent.__path__, 'agent.') if not m.name.endswith('__main__')]; \
sdk = sys.argv[1:]; \
[importlib.import_module(name) for name in own + sdk]; \
assert not [m for m in sys.modules if m.startswith(('aiohttp', 'kubernetes.aio'))], 'asyncio half imported'; \
files = sorted({m.__file__ for m in list(sys.modules.values()) \
    if (getattr(m, '__file__', None) or '').startswith('/opt/node-health-agent/') and m.__file__.endswith('.py')}); \
mode = py_compile.PycInvalidationMode.UNCHECKED_HASH; \
[py_compile.compile(f, doraise=True, invalidation_mode=mode) for f in files]; \
print(len(files), 'imported modules compiled')" \
        kubernetes.client kubernetes.config kubernetes.client.exceptions kubernetes.config.config_exception \
        urllib3.exceptions botocore.session botocore.config botocore.loaders botocore.parsers \
        botocore.exceptions grpc

FROM python:3.11.11-slim-bookworm AS agent

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PATH=/opt/node-health-agent/bin:$PATH

COPY --from=build /opt/node-health-agent /opt/node-health-agent

# Run from / so that nothing is imported from a source tree; the installed package is used.
WORKDIR /

# Non-root by default (the numeric uid needs no passwd entry). The DaemonSet runs only the
# kmsg-relay container (privileged) and a one-shot chown init container as root.
USER 65532:65532

ENTRYPOINT ["node-health-agent"]
CMD ["run"]

# The journald variant: journalctl, for node-problem-detector journald monitors (plugin: journald; the
# agent runs `journalctl --follow --output=json`). Debian ships journalctl only in the systemd package,
# about 105 MB with what it pulls in (measured: bench/run.py image), so only this variant has it; the
# default image refuses a journald monitor at start with a message naming this variant. Nothing of
# systemd runs: the entrypoint is the agent. Versions come from the pinned base's Debian release
# (bookworm); pinning each package version would break the build at every Debian point release, hence
# DL3008 is ignored here.
FROM agent AS journald
USER 0:0
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends systemd \
    && journalctl --version \
    && rm -rf /var/lib/apt/lists/*
USER 65532:65532

# The default image (what `docker build .` builds): the agent stage.
FROM agent
