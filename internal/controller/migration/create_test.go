package migration

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/zfs-nomad/zfs-nomad/internal/controller/agentclient"
	"github.com/zfs-nomad/zfs-nomad/internal/controller/cluster"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
)

// TestCreationPlan: where a new volume goes and which generation is
// reserved for it, from the promises racing creations left.
func TestCreationPlan(t *testing.T) {
	// p is "recorder:generation:holder".
	tests := []struct {
		name     string
		nodes    int // answering: n1..nN
		silent   int
		promises []string
		want     string // "node gen", or the error's kind
	}{
		{"no promise: the first candidate", 3, 0, nil, "n2 1"},
		{"an earlier attempt's promise, a majority and its own", 3, 0, []string{"n1:1:n3", "n3:1:n3"}, "n3 1"},
		{"an earlier attempt's promise, no majority yet: tried again", 3, 0, []string{"n3:1:n3"}, "n3 1"},
		{"split so neither can win: each holder's node promised the other", 3, 0, []string{"n1:1:n3", "n3:1:n1", "n2:1:n1"}, "n1 2"},
		{"two against two: the lower ID takes the next generation", 4, 0, []string{"n1:1:n1", "n2:1:n1", "n3:1:n3", "n4:1:n3"}, "n1 2"},
		{"the other may have won with the silent node", 4, 1, []string{"n1:1:n1", "n2:1:n1", "n3:1:n3", "n4:1:n3"}, "aborted"},
		{"a holder of the top generation is silent", 2, 1, []string{"n1:1:n3"}, "unavailable"},
		{"a split above a split", 3, 0, []string{"n1:2:n3", "n3:2:n1", "n2:1:n1"}, "n1 3"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var v view
			for i := 1; i <= tt.nodes; i++ {
				v.nodes = append(v.nodes, cluster.Node{Info: agentclient.NodeInfo{NodeID: fmt.Sprintf("n%d", i)}})
			}
			for i := range tt.silent {
				v.unreachable = append(v.unreachable, fmt.Sprintf("silent-%d:7670", i))
			}
			v.promises = promisesOf(tt.promises)
			n, gen, err := v.creationPlan("vol-1", []string{"n2", "n1"})
			got := fmt.Sprintf("%s %d", n.Info.NodeID, gen)
			switch {
			case errors.Is(err, errdefs.ErrAborted):
				got = "aborted"
			case errors.Is(err, errdefs.ErrUnavailable):
				got = "unavailable"
			case err != nil:
				got = err.Error()
			}
			if got != tt.want {
				t.Errorf("plan %q (%v), want %q", got, err, tt.want)
			}
		})
	}
}

// promisesOf reads promises written "recorder:generation:holder".
func promisesOf(specs []string) []promised {
	var out []promised
	for _, p := range specs {
		f := strings.Split(p, ":")
		var gen uint64
		fmt.Sscan(f[1], &gen)
		out = append(out, promised{recorder: f[0], generation: gen, holder: f[2]})
	}
	return out
}

// TestCreationLookPrimary: a create answers the volume an earlier attempt
// made on the node of its newest primary; a replica, a node that could
// not say, or no copy at all is no volume.
func TestCreationLookPrimary(t *testing.T) {
	answer := func(node string, c agentclient.Copy, err error) cluster.Answer[agentclient.Copy] {
		return cluster.Answer[agentclient.Copy]{Node: cluster.Node{Info: agentclient.NodeInfo{NodeID: node}}, Object: c, Err: err}
	}
	primary := func(gen uint64) agentclient.Copy {
		return agentclient.Copy{Exists: true, Role: contract.RolePrimary, Generation: gen}
	}
	tests := []struct {
		name    string
		answers []cluster.Answer[agentclient.Copy]
		want    string // "": none
	}{
		{"nothing anywhere", []cluster.Answer[agentclient.Copy]{answer("n1", agentclient.Copy{}, nil), answer("n2", agentclient.Copy{}, nil)}, ""},
		{"one primary", []cluster.Answer[agentclient.Copy]{answer("n1", agentclient.Copy{}, nil), answer("n2", primary(1), nil)}, "n2"},
		{"a move's two primaries: the newest", []cluster.Answer[agentclient.Copy]{answer("n1", primary(2), nil), answer("n2", primary(3), nil), answer("n3", primary(1), nil)}, "n2"},
		{"a replica is no volume", []cluster.Answer[agentclient.Copy]{answer("n1", agentclient.Copy{Exists: true, Role: contract.RoleReplica, Generation: 4}, nil)}, ""},
		{"a node that could not say", []cluster.Answer[agentclient.Copy]{answer("n1", primary(2), errors.New("busy")), answer("n2", agentclient.Copy{}, nil)}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			look := CreationLook{view: (&Migrator{log: hclog.NewNullLogger()}).viewOf("v", tt.answers, nil)}
			n, ok := look.Primary()
			if got := n.Info.NodeID; ok != (tt.want != "") || got != tt.want {
				t.Errorf("Primary() = %q, %v; want %q", got, ok, tt.want)
			}
		})
	}
}
