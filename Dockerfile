# The controller image the Helm chart runs (charts/slotwise: image.repository/tag).
#   docker build -t slotwise:0.1.0 .
# Non-root (UID 65532, as the chart's securityContext expects) and fine on a read-only root filesystem:
# nothing is written outside /tmp, which the chart mounts as an emptyDir.
FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 MPLCONFIGDIR=/tmp
WORKDIR /src
COPY pyproject.toml README.md ./
COPY autoscaler ./autoscaler
COPY forecasting ./forecasting
COPY sharing ./sharing
RUN pip install --no-cache-dir . && rm -rf /src
USER 65532:65532
ENTRYPOINT ["slotwise"]
CMD ["run"]
