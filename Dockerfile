# swapgate: build a virtualenv in one stage, run it as a non-root user in a slim one.
FROM python:3.11-slim AS build
WORKDIR /src
RUN python -m venv /opt/swapgate
COPY pyproject.toml README.md ./
COPY swapgate ./swapgate
RUN /opt/swapgate/bin/pip install --no-cache-dir .

FROM python:3.11-slim
RUN useradd --system --uid 10001 --home-dir /nonexistent --shell /usr/sbin/nologin swapgate \
 && install -d -o swapgate -g swapgate -m 0700 /var/lib/swapgate
COPY --from=build /opt/swapgate /opt/swapgate
# The activity log and the learned demand live in SWAPGATE_STATE_DIR (docs/deploy.md)
ENV PATH=/opt/swapgate/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    SWAPGATE_STATE_DIR=/var/lib/swapgate \
    SWAPGATE_CONFIG=/etc/swapgate/config.yaml \
    SWAPGATE_SERVER__HOST=0.0.0.0
USER swapgate
VOLUME ["/var/lib/swapgate"]
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
  CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:' + os.environ.get('SWAPGATE_SERVER__PORT', '8080') + '/healthz', timeout=2)"]
ENTRYPOINT ["swapgate"]
CMD ["serve"]
