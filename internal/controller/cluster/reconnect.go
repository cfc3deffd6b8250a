package cluster

import (
	"context"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/zfs-nomad/zfs-nomad/internal/shared/connpool"
)

// DefaultReconnectWait bounds the wait for a new connection to an agent
// whose connection had failed: long enough for a node that is back to
// answer on a new connection.
const DefaultReconnectWait = 2 * time.Second

// outages are the agents whose connection stayed down through a
// reconnect wait, each watched until its connection is ready again.
//
// The rule: a node that is back must be seen soon (a failover's old
// primary must be fenced, a move may wait for it), and a node that stays
// down must cost a call no more than its failure. Only a wait tells one
// from the other (gRPC reports a connection failed until a new one is
// ready), so the wait is paid once an outage, not once a call. A call
// that finds an agent's connection down dials again at once and waits up
// to the reconnect wait for it; if the node still does not answer, it is
// in an outage: calls to it fail at once instead of each waiting again
// (every decision asks every node, so a wait per call adds it to every
// publish and create while any node is down), and a watcher dials it
// again every quarter of the wait until its connection is ready, when
// calls reach it again. A node back from an outage is seen within that
// quarter and a connection's setup; a call before that is Unavailable,
// which the CO retries.
type outages struct {
	pool *connpool.Pool
	// stop ends the watchers (Cluster.Close).
	stop context.Context
	log  hclog.Logger

	mu   sync.Mutex
	down map[string]bool
}

func newOutages(pool *connpool.Pool, stop context.Context, log hclog.Logger) *outages {
	return &outages{pool: pool, stop: stop, log: log, down: map[string]bool{}}
}

// isDown reports whether addr is in an outage.
func (o *outages) isDown(addr string) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.down[addr]
}

// begin puts addr in an outage, whose watcher dials it every period until
// its connection is ready. An agent whose connection the pool does not
// hold (an in-memory fake) has no connection to watch: it is never in
// one.
func (o *outages) begin(addr string, period time.Duration) {
	if !o.pool.Holds(addr) {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.down[addr] {
		return
	}
	o.down[addr] = true
	o.log.Warn("node agent down: calls to it fail at once until it answers again; redialling it", "addr", addr, "every", period)
	go o.watch(addr, period)
}

// watch ends addr's outage once its connection is ready.
func (o *outages) watch(addr string, period time.Duration) {
	for o.stop.Err() == nil {
		ctx, cancel := context.WithTimeout(o.stop, period)
		ready := o.pool.AwaitReady(ctx, addr)
		cancel()
		if ready {
			o.mu.Lock()
			delete(o.down, addr)
			o.mu.Unlock()
			o.log.Info("node agent answers again: calls reach it", "addr", addr)
			return
		}
	}
}
