// Command natsd runs the same embedded NATS server the sidecar uses, on its
// own: for worker authors and for the Node and Python worker tests, which
// need a real server and must not download one.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/projectdavid/toolsidecar/embedded"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:4222", "host:port; port -1 picks a free one")
	urlFile := flag.String("url-file", "", "write the client URL to this file once ready")
	password := flag.String("worker-password", "", "let in only the user worker, with this password (a test of connecting without credentials)")
	flag.Parse()
	// A development server for worker authors and the worker libraries'
	// tests: anyone on the listener may connect (bind it to loopback).
	cfg := embedded.Config{Listen: *listen, AllowAnonymous: *password == ""}
	if *password != "" {
		cfg.Workers = []embedded.Worker{{Name: "worker", Password: *password, Subscribe: []string{">"}}}
	}
	ns, err := embedded.Start(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "natsd:", err)
		os.Exit(1)
	}
	if *urlFile != "" {
		if err := os.WriteFile(*urlFile, []byte(ns.ClientURL()), 0o600); err != nil {
			fmt.Fprintln(os.Stderr, "natsd:", err)
			ns.Shutdown()
			os.Exit(1)
		}
	}
	fmt.Println(ns.ClientURL())
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	<-sigs
	ns.Shutdown()
}
