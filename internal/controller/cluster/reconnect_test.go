package cluster_test

import (
	"context"
	"testing"
	"time"

	"github.com/zfs-nomad/zfs-nomad/internal/controller/cluster"
	"github.com/zfs-nomad/zfs-nomad/internal/controller/cluster/clustertest"
)

// TestADownAgentCostsOneWait: the first call that finds an agent's
// connection down waits for a new one (the reconnect wait); while the
// node stays down, later calls fail at once instead of each waiting
// again; once the node is back, calls reach it within a quarter of the
// wait, without any call waiting for it.
//
// The shipped wait: the bounds (half of it for a call that fails at once)
// leave a loaded machine room.
func TestADownAgentCostsOneWait(t *testing.T) {
	const wait = cluster.DefaultReconnectWait
	var served clustertest.Agents
	n1, n2 := &agent{id: "n1"}, &agent{id: "n2"}
	served.Serve(t, "n1:7670", n1)
	served.Serve(t, "n2:7670", n2)
	c := served.Cluster(t)
	c.ReconnectWait = wait
	ctx := context.Background()

	// nodes asks every agent and reports how long it took and whether n2
	// answered.
	nodes := func() (time.Duration, bool) {
		t.Helper()
		start := time.Now()
		answered, unreachable, err := c.Nodes(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(answered)+len(unreachable) != 2 {
			t.Fatalf("answered %v, unreachable %v: want both nodes in one or the other", answered, unreachable)
		}
		return time.Since(start), len(answered) == 2
	}
	if _, both := nodes(); !both {
		t.Fatal("n2 does not answer before it is stopped")
	}

	served.Stop("n2:7670")
	took, both := nodes()
	if both || took < wait {
		t.Errorf("the first call after n2 stopped took %v, n2 answering %v: want it unreachable after waiting %v for a new connection", took, both, wait)
	}
	for range 3 {
		if took, both := nodes(); both || took > wait/2 {
			t.Errorf("a call while n2 is down took %v, n2 answering %v: want it unreachable at once", took, both)
		}
	}

	served.Serve(t, "n2:7670", n2)
	back := time.Now()
	for {
		took, both := nodes()
		if took > wait/2 {
			t.Errorf("a call after n2 is back took %v: want no call to wait for it", took)
		}
		if both {
			break
		}
		if time.Since(back) > 2*wait {
			t.Fatalf("n2 is still unreachable %v after it is back: want it reached within a quarter of the wait (%v)", time.Since(back), wait/4)
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("n2 answered %v after it was back", time.Since(back))
}
