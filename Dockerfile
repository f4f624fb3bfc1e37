# syntax=docker/dockerfile:1
# A static toolsidecar binary on distroless, running as non-root.
FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
# docker build --build-arg VERSION=v1.2.3 --build-arg REVISION=$(git rev-parse HEAD)
# (.git is not in the build context, so the toolchain cannot stamp it).
ARG VERSION=dev
ARG REVISION=unknown
RUN CGO_ENABLED=0 go build -trimpath -buildvcs=false \
    -ldflags="-s -w -X github.com/projectdavid/toolsidecar/internal/version.Version=${VERSION} -X github.com/projectdavid/toolsidecar/internal/version.Revision=${REVISION}" \
    -o /out/toolsidecar ./cmd/toolsidecar

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/toolsidecar /usr/local/bin/toolsidecar
COPY config.yaml /etc/toolsidecar/config.yaml
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/toolsidecar"]
CMD ["run", "--config", "/etc/toolsidecar/config.yaml"]
