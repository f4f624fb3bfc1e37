package natstest

import (
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/projectdavid/toolsidecar/testkit/poll"
)

// Cluster is n NATS servers with JetStream, routed to each other on
// loopback, as a production cluster is; clients connect anonymously.
type Cluster struct {
	Nodes []*server.Server
}

// StartCluster starts n nodes and waits until JetStream has a meta leader
// that every node follows. Every node is shut down by t.Cleanup.
func StartCluster(t testing.TB, n int) *Cluster {
	t.Helper()
	clientPorts, routePorts := freePorts(t, n), freePorts(t, n)
	routes := make([]string, n)
	for i, p := range routePorts {
		routes[i] = fmt.Sprintf("nats://127.0.0.1:%d", p)
	}
	c := &Cluster{}
	root := t.TempDir()
	t.Cleanup(func() { // at once: a node waits for its peers when they leave one by one
		var wg sync.WaitGroup
		for _, ns := range c.Nodes {
			wg.Go(ns.Shutdown)
		}
		wg.Wait()
	})
	for i := range n {
		opts := &server.Options{ServerName: fmt.Sprintf("node-%d", i), Host: "127.0.0.1", Port: clientPorts[i],
			JetStream: true, StoreDir: filepath.Join(root, fmt.Sprint(i)), NoLog: true, NoSigs: true,
			SyncAlways: true, // as docs/durable-mode.md asks of a production cluster
			Cluster:    server.ClusterOpts{Name: "toolsidecar-test", Host: "127.0.0.1", Port: routePorts[i]},
			Routes:     server.RoutesFromStr(strings.Join(routes, ","))}
		ns, err := server.NewServer(opts)
		if err != nil {
			t.Fatal(err)
		}
		go ns.Start()
		if !ns.ReadyForConnections(10 * time.Second) {
			t.Fatalf("cluster node %d not ready", i)
		}
		c.Nodes = append(c.Nodes, ns)
	}
	poll.Until(t, "the JetStream cluster to elect a meta leader", func() bool {
		leaders := 0
		for _, ns := range c.Nodes {
			if !ns.JetStreamIsCurrent() {
				return false
			}
			if ns.JetStreamIsLeader() {
				leaders++
			}
		}
		return leaders == 1
	})
	return c
}

// URL lists every node's client URL, as a client's server list.
func (c *Cluster) URL() string {
	urls := make([]string, len(c.Nodes))
	for i, ns := range c.Nodes {
		urls[i] = ns.ClientURL()
	}
	return strings.Join(urls, ",")
}

// StreamLeader is the node that leads the named stream (in the default
// account), or nil.
func (c *Cluster) StreamLeader(stream string) *server.Server {
	for _, ns := range c.Nodes {
		if ns.Running() && ns.JetStreamIsStreamLeader(server.DEFAULT_GLOBAL_ACCOUNT, stream) {
			return ns
		}
	}
	return nil
}

func freePorts(t testing.TB, n int) []int {
	t.Helper()
	ports := make([]int, n)
	for i := range ports {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		ports[i] = ln.Addr().(*net.TCPAddr).Port
	}
	return ports
}
