package migration

import (
	"testing"

	"github.com/zfs-nomad/zfs-nomad/internal/controller/agentclient"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
)

// TestDeletionGeneration: a deletion reserves one above every copy and
// promise the nodes show, or its own when that is the newest already.
func TestDeletionGeneration(t *testing.T) {
	primary := func(gen uint64) agentclient.Copy {
		return agentclient.Copy{Exists: true, Role: contract.RolePrimary, Generation: gen}
	}
	promised := func(c agentclient.Copy, gen uint64, holder string) agentclient.Copy {
		c.PromisedGeneration, c.PromisedHolder = gen, holder
		return c
	}
	tests := []struct {
		name   string
		copies []agentclient.Copy
		want   uint64
	}{
		{"a primary and its own promise", []agentclient.Copy{promised(primary(3), 3, "n1"), promised(agentclient.Copy{}, 3, "n1")}, 4},
		{"a promise above every copy (a move's)", []agentclient.Copy{primary(3), promised(agentclient.Copy{}, 5, "n2")}, 6},
		{"a copy nobody promised any more (a replica's label)", []agentclient.Copy{{Exists: true, Role: contract.RoleReplica, Generation: 7}}, 8},
		{"the deletion's own is the newest: a retried delete", []agentclient.Copy{promised(primary(3), 4, contract.DeletionHolder), promised(agentclient.Copy{}, 4, contract.DeletionHolder)}, 4},
		{"a newer promise beside the deletion's: above both", []agentclient.Copy{promised(primary(3), 4, contract.DeletionHolder), promised(agentclient.Copy{}, 5, "n2")}, 6},
		{"a copy that does not exist counts no generation", []agentclient.Copy{{Exists: false, Generation: 9}, promised(agentclient.Copy{}, 2, "n1")}, 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := deletionGeneration(tt.copies); got != tt.want {
				t.Errorf("deletionGeneration = %d, want %d", got, tt.want)
			}
		})
	}
}
