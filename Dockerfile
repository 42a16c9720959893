# One image for every role (name server, broker, gateways), built in stages so the compiler
# stays out of it; a second target, `spark`, adds Java and PySpark for the telemetry job.
# docker-compose.yml builds both; `docker build --target runtime -t lmq-gateway .` builds
# the small one alone. docs/deploy.md describes the stack.

# -- build: wheels for lmq-gateway (with its C extension) and its dependencies ----------
FROM python:3.11-slim AS build
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY core core
COPY gateway gateway
COPY spark_sinks spark_sinks
COPY lmq lmq
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

# -- runtime: the wheels, no compiler, a non-root user ----------------------------------
FROM python:3.11-slim AS runtime
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir --no-index --find-links /wheels lmq-gateway \
    && rm -rf /wheels \
    && (cd / && python -c "import core._speedups") \
    && useradd --system --uid 10001 --home-dir /data --shell /usr/sbin/nologin lmq \
    && mkdir -p /data /out && chown lmq:lmq /data /out
USER lmq
WORKDIR /data
VOLUME /data
# name server, broker, broker HA (replication), MQTT, AMQP 0-9-1, metrics / dashboard
EXPOSE 9876 10911 10912 1883 5672 9100
# Alone (`docker run`), the embedded server: published ports need a non-loopback bind
# inside the container, which with ACL off must be allowed explicitly (docs/remoting.md);
# publish them on the host's loopback (`-p 127.0.0.1:1883:1883`) unless ACL is on.
CMD ["lmq", "serve", "--data-dir", "/data", "--host", "0.0.0.0", "--allow-unauthenticated"]

# -- spark: the runtime plus Java 17 and PySpark, for `lmq demo iot` ---------------------
FROM runtime AS spark
USER root
RUN mkdir -p /usr/share/man/man1 \
    && apt-get update && apt-get install -y --no-install-recommends openjdk-17-jre-headless \
    && rm -rf /var/lib/apt/lists/* \
    && pip install --no-cache-dir "pyspark>=4.2" pyarrow
USER lmq
WORKDIR /out
CMD ["lmq", "demo", "iot", "--duration", "0", "--out", "/out"]
