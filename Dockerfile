# One image for the broker, the controller and the operator: `ferrymq broker|controller|operator ...`.
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md* ./
COPY ferrymq ferrymq
COPY common common
COPY broker broker
COPY controller controller
COPY operator operator
COPY client client
COPY pipeline pipeline
RUN pip wheel --no-cache-dir --wheel-dir /wheels ".[operator]"

FROM python:3.11-slim
# No compilers or caches in the runtime image; only the wheels built above.
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir --no-index --find-links /wheels "ferrymq[operator]" \
    && rm -rf /wheels \
    && groupadd --system --gid 10001 ferrymq \
    && useradd --system --uid 10001 --gid ferrymq --home-dir /home/ferrymq --create-home ferrymq \
    && mkdir -p /data && chown ferrymq:ferrymq /data
USER 10001:10001
WORKDIR /home/ferrymq
ENV PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
EXPOSE 8080 9876 10911 10912
VOLUME ["/data"]
ENTRYPOINT ["ferrymq"]
CMD ["--help"]
