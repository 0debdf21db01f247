# The central service (with the simulator and risk models, so compose's simulated agents run from
# this image too). GPU nodes install the agent with `pip install 'fleetwatch[agent]'` instead.
#
# One definition, two ways to build it:
# - with a registry: `docker build .` (or `podman build .`) starts from debian:bookworm-slim,
#   installs DEBIAN_PACKAGES with apt-get and the Python dependencies from PyPI;
# - without one: `make image` (scripts/build-image.sh) builds the same Debian base itself with
#   mmdebstrap, reading the suite from BASE below and the package list from DEBIAN_PACKAGES, and
#   passes it in as BASE; the apt-get step then finds every package installed and does nothing.
# Debian's own python3 (3.11 on bookworm) in both, rather than python:3.x-slim's: mmdebstrap can
# only make the former, and one Python for both is what keeps the two images the same.
ARG BASE=docker.io/library/debian:bookworm-slim

FROM ${BASE} AS runtime
# On every stage's layers: scripts/build-image.sh prunes the untagged ones by this label.
LABEL org.opencontainers.image.title="FleetWatch" \
      org.opencontainers.image.description="GPU fleet health monitoring: server, simulator, models" \
      org.opencontainers.image.licenses="Apache-2.0"
ARG DEBIAN_PACKAGES="python3 python3-venv ca-certificates"
RUN dpkg -s $DEBIAN_PACKAGES >/dev/null 2>&1 || { \
      apt-get update \
      && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $DEBIAN_PACKAGES \
      && rm -rf /var/lib/apt/lists/*; \
    }

# The wheel, built from this checkout as `pip wheel .` builds it on a workstation; the build
# backend (pyproject.toml's build-system) installed first, in a layer the source does not change.
FROM runtime AS wheel
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
COPY pyproject.toml deploy/image/requirements.py /src/
RUN python3 /src/requirements.py /src/pyproject.toml --build >/tmp/build-requirements.txt \
    && python3 -m venv /tmp/build \
    && /tmp/build/bin/pip install --requirement /tmp/build-requirements.txt
COPY README.md /src/
COPY src /src/src
COPY docs/runbooks /src/docs/runbooks
RUN /tmp/build/bin/pip wheel --no-build-isolation --no-deps --wheel-dir /dist /src

FROM runtime
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# The extras the image serves, so that one image runs every pod of the Helm chart: the server,
# the models, the agent (nvidia-ml-py), k8s-sync (the kubernetes client) and the simulator
# (compose's simulated agents). Their dependencies go in a layer of their own, rebuilt only when
# pyproject.toml changes.
ARG EXTRAS=server,models,agent,k8s,sim
COPY pyproject.toml deploy/image/requirements.py /tmp/fleetwatch/
RUN python3 /tmp/fleetwatch/requirements.py /tmp/fleetwatch/pyproject.toml "$EXTRAS" \
      >/tmp/fleetwatch/requirements.txt \
    && python3 -m venv /opt/fleetwatch \
    && /opt/fleetwatch/bin/pip install --requirement /tmp/fleetwatch/requirements.txt \
    && rm -rf /tmp/fleetwatch
# A fixed uid and gid (10001): Kubernetes' runAsNonRoot can check a numeric USER only. Its home,
# the working directory, holds the default SQLite database (sqlite:///fleetwatch.db).
RUN groupadd --system --gid 10001 fleetwatch \
    && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/fleetwatch \
      --shell /usr/sbin/nologin fleetwatch \
    && install -d -o 10001 -g 10001 -m 0750 /var/lib/fleetwatch
COPY --from=wheel /dist /tmp/dist
RUN /opt/fleetwatch/bin/pip install --no-deps --no-index /tmp/dist/fleetwatch-*.whl \
    && /opt/fleetwatch/bin/pip check \
    && rm -rf /tmp/dist

ENV PATH=/opt/fleetwatch/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
USER 10001:10001
WORKDIR /var/lib/fleetwatch
EXPOSE 8400
# The server's port (FLEETWATCH_SERVER_PORT, else 8400), over HTTPS when the server serves TLS (src/fleetwatch/healthcheck.py).
HEALTHCHECK --interval=10s --timeout=3s CMD ["/opt/fleetwatch/bin/python", "-m", "fleetwatch.healthcheck"]
ENTRYPOINT ["fleetwatch"]
CMD ["server", "--host", "0.0.0.0"]
