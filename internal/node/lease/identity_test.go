package lease

import (
	"context"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
)

// TestPingCountsOnlyANodeAnsweringAsItself: every node certificate
// carries the same server name, so without a check a node could answer a
// ping as another node and count for this node's lease as that node. The
// client refuses such an answer (agent.PeerClient checks the certificate:
// agent's TestPeerClientHoldsAnswersToTheirNode); the heartbeat must then
// not count it.
func TestPingCountsOnlyANodeAnsweringAsItself(t *testing.T) {
	for _, tc := range []struct {
		name, cert, says string
		counted          bool
	}{
		{"as itself", "n2", "n2", true},
		{"as another node", "liar", "n2", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			net := newMemNet()
			net.serve("n2:7670", tc.says, nil)
			net.liars["n2:7670"] = tc.cert
			h := &Heartbeat{
				Monitor:  NewMonitor(time.Minute, time.Now),
				NodeID:   "n1",
				Interval: 2 * time.Second,
				Peers:    func() ([]string, error) { return []string{"n2:7670"}, nil },
				Client:   net.client("n1"),
				Volumes:  &fakeVolumes{},
				Log:      hclog.NewNullLogger(),
			}
			h.beat(context.Background())
			if got := h.Monitor.nodeOf("n2:7670") != ""; got != tc.counted {
				t.Fatalf("the ping was counted: %v, want %v", got, tc.counted)
			}
			if got := h.Monitor.Held("n1"); got != tc.counted {
				t.Errorf("lease held: %v, want %v", got, tc.counted)
			}
		})
	}
}
