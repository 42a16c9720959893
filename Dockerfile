# One image for every role: name server, broker, embedded server (and later gateways).
FROM python:3.11-slim
WORKDIR /opt/lmq
COPY pyproject.toml setup.py README.md ./
COPY core core
COPY gateway gateway
COPY spark_sinks spark_sinks
COPY lmq lmq
COPY bench bench
# gcc builds the store's C extension (core._speedups), then leaves the image.
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev \
    && pip install --no-cache-dir . \
    && (cd / && python -c "import core._speedups") \
    && apt-get purge -y gcc libc6-dev && apt-get autoremove -y && rm -rf /var/lib/apt/lists/*
VOLUME /data
EXPOSE 9876 10911
# Published ports need a non-loopback bind inside the container; with ACL off that must
# be allowed explicitly (docs/remoting.md).
CMD ["lmq", "serve", "--data-dir", "/data", "--host", "0.0.0.0", "--allow-unauthenticated"]
