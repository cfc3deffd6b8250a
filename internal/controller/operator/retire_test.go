package operator

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/zfs-nomad/zfs-nomad/internal/controller/agentclient"
	"github.com/zfs-nomad/zfs-nomad/internal/controller/cluster"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/peers"
)

// retiringAgent is a node agent that answers GetNode and RetirePeer.
type retiringAgent struct {
	cluster.NodeAgent // nil: RetireNode calls nothing else
	info              agentclient.NodeInfo
	refuse            error
	retired           []string
}

func (a *retiringAgent) GetNode(context.Context, agentclient.GetNodeOptions) (agentclient.NodeInfo, error) {
	return a.info, nil
}

func (a *retiringAgent) RetirePeer(_ context.Context, nodeID string) (int, error) {
	if a.refuse != nil {
		return 0, a.refuse
	}
	a.retired = append(a.retired, nodeID)
	return a.info.KnownNodes - 1, nil
}

func TestRetireNode(t *testing.T) {
	node := func(id string, known int, retired ...string) *retiringAgent {
		return &retiringAgent{info: agentclient.NodeInfo{NodeID: id, KnownNodes: known, RetiredNodes: retired}}
	}
	tests := []struct {
		name    string
		agents  map[string]*retiringAgent // by address; nil: does not answer
		wantErr error
		wantMsg string
		told    []string // the addresses told to retire n3
	}{
		{name: "every other node told", agents: map[string]*retiringAgent{"a1": node("n1", 3), "a2": node("n2", 3)}, told: []string{"a1", "a2"}},
		{name: "again after a partial run", agents: map[string]*retiringAgent{"a1": node("n1", 2, "n3"), "a2": node("n2", 3)}, told: []string{"a1", "a2"}},
		{name: "the node still answers", agents: map[string]*retiringAgent{"a1": node("n1", 3), "a3": node("n3", 3)},
			wantErr: errdefs.ErrFailedPrecondition, wantMsg: "n3 still answers at a3"},
		{name: "a node does not answer", agents: map[string]*retiringAgent{"a1": node("n1", 3), "a2": nil},
			wantErr: errdefs.ErrUnavailable, wantMsg: "a2 did not answer"},
		{name: "a node retired another", agents: map[string]*retiringAgent{"a1": node("n1", 3), "a2": node("n2", 3, "n4")},
			wantErr: errdefs.ErrFailedPrecondition, wantMsg: "n2 retired n4 since it started"},
		{name: "no node keeps a lease", agents: map[string]*retiringAgent{"a1": node("n1", 0), "a2": node("n2", 0)},
			wantErr: errdefs.ErrFailedPrecondition, wantMsg: "nothing to retire"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var addrs []string
			for a := range tt.agents {
				addrs = append(addrs, a)
			}
			cl := cluster.NewWithAgents(peers.Configured(addrs, ""), func(addr string) (cluster.NodeAgent, error) {
				if a := tt.agents[addr]; a != nil {
					return a, nil
				}
				return nil, errors.New("connection refused")
			}, time.Second, hclog.NewNullLogger())
			var out bytes.Buffer
			err := RetireNode(context.Background(), cl, "n3", &out)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) || !strings.Contains(err.Error(), tt.wantMsg) {
					t.Fatalf("RetireNode = %v, want %v saying %q", err, tt.wantErr, tt.wantMsg)
				}
				for addr, a := range tt.agents {
					if a != nil && len(a.retired) > 0 {
						t.Errorf("a refused retirement told %s", addr)
					}
				}
				return
			}
			if err != nil {
				t.Fatalf("RetireNode: %v", err)
			}
			for _, addr := range tt.told {
				if a := tt.agents[addr]; len(a.retired) != 1 || a.retired[0] != "n3" {
					t.Errorf("%s was told %v, want [n3]", addr, a.retired)
				}
				if !strings.Contains(out.String(), tt.agents[addr].info.NodeID+" no longer counts n3") {
					t.Errorf("the output does not name %s:\n%s", tt.agents[addr].info.NodeID, out.String())
				}
			}
		})
	}
}

// TestRetireNodeReportsTheNodesThatRefused: a node that refuses (n3 heard
// too lately) is named, and the others' retirement is reported.
func TestRetireNodeReportsTheNodesThatRefused(t *testing.T) {
	agents := map[string]*retiringAgent{
		"a1": {info: agentclient.NodeInfo{NodeID: "n1", KnownNodes: 3}},
		"a2": {info: agentclient.NodeInfo{NodeID: "n2", KnownNodes: 3}, refuse: errdefs.Wrap(errdefs.ErrFailedPrecondition, "node n2 heard from n3 4s ago")},
	}
	cl := cluster.NewWithAgents(peers.Configured([]string{"a1", "a2"}, ""), func(addr string) (cluster.NodeAgent, error) { return agents[addr], nil },
		time.Second, hclog.NewNullLogger())
	var out bytes.Buffer
	err := RetireNode(context.Background(), cl, "n3", &out)
	if err == nil || !strings.Contains(err.Error(), "node n2: node n2 heard from n3 4s ago") || !strings.Contains(err.Error(), "run retire-node again") {
		t.Fatalf("RetireNode = %v, want n2's refusal and what to do", err)
	}
	if !strings.Contains(out.String(), "n1 no longer counts n3: its lease counts 2 nodes") {
		t.Errorf("n1's retirement is not reported:\n%s", out.String())
	}
}
