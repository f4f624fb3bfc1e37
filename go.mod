module github.com/projectdavid/toolsidecar

go 1.26.8

require (
	github.com/tmaxmax/go-sse v0.12.0
	go.uber.org/goleak v1.3.0
	go.yaml.in/yaml/v3 v3.0.6
)

require github.com/stretchr/testify v1.8.4 // indirect
