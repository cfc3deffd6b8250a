package tlsconfig

import (
	"slices"
	"testing"
)

func TestAgentPolicy(t *testing.T) {
	tests := []struct {
		method string
		want   []string
	}{
		{"/zfsnomad.agent.v1.NodeAgent/GetNode", []string{RoleController, RoleOperator}},
		{"/zfsnomad.agent.v1.NodeAgent/WorkLeases", []string{RoleController, RoleOperator}},
		{"/zfsnomad.agent.v1.NodeAgent/AcquireWorkLease", []string{RoleController}},
		{"/zfsnomad.agent.v1.NodeAgent/RetirePeer", []string{RoleOperator}},
		{"/zfsnomad.agent.v1.Replication/Receive", []string{RoleNode}},
		{"/zfsnomad.agent.v1.Peers/Ping", []string{RoleNode}},
		{"/other.Service/Call", nil},
	}
	for _, tt := range tests {
		if got := AgentPolicy.allowed(tt.method); !slices.Equal(got, tt.want) {
			t.Errorf("%s: allowed %v, want %v", tt.method, got, tt.want)
		}
	}
}
