# The central service (with the simulator and risk models, so compose's simulated agents run from
# this image too). GPU nodes install the agent with `pip install 'fleetwatch[agent]'` instead.
FROM python:3.12-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /app
COPY pyproject.toml README.md ./
COPY src ./src
RUN pip install '.[server,sim,models]' && useradd --system --uid 10001 fleetwatch
USER fleetwatch
EXPOSE 8400
HEALTHCHECK --interval=10s --timeout=3s \
  CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8400/healthz')"
ENTRYPOINT ["fleetwatch"]
CMD ["server", "--host", "0.0.0.0"]
