# syntax=docker/dockerfile:1
# A static toolsidecar binary on distroless, running as non-root.
FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/toolsidecar ./cmd/toolsidecar

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/toolsidecar /usr/local/bin/toolsidecar
COPY config.yaml /etc/toolsidecar/config.yaml
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/toolsidecar"]
CMD ["run", "--config", "/etc/toolsidecar/config.yaml"]
