# The controller image the Helm chart runs: its default image is slotwise:<appVersion> (charts/slotwise values
# image.repository/tag; appVersion = pyproject.toml's version), so build it under that name:
#   docker build -t slotwise:0.1.0 .
# then make it reachable from the cluster: load it into a local one (`kind load docker-image slotwise:0.1.0`,
# `minikube image load slotwise:0.1.0`), or tag and push it to a registry and install the chart with
# --set image.repository=<registry>/slotwise (README.md "On a cluster"). The build context is an allow-list
# (.dockerignore): only what is COPYed below.
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
