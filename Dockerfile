# One image for every role: name server, broker, embedded server (and later gateways).
FROM python:3.11-slim
WORKDIR /opt/lmq
COPY pyproject.toml README.md ./
COPY core core
COPY gateway gateway
COPY spark_sinks spark_sinks
COPY lmq lmq
COPY bench bench
RUN pip install --no-cache-dir .
VOLUME /data
EXPOSE 9876 10911
CMD ["lmq", "serve", "--data-dir", "/data"]
