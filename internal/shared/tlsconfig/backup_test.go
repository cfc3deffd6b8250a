package tlsconfig

import (
	"context"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/test/bufconn"
)

// TestTargetsAndNodesCannotPoseAsEachOther: a client dialling a node
// (DialOptions) accepts only a node's certificate, and one dialling a
// backup target (BackupDialOptions) only a target's, whatever CA issued
// both; so a node cannot receive what was meant for the backup target,
// nor a target answer as a node.
func TestTargetsAndNodesCannotPoseAsEachOther(t *testing.T) {
	ca := newTestCA(t)
	source := func(name, role string) *Source {
		files, err := ca.IssueInto(t.TempDir(), name, role, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		s, err := NewSource(files, Identity{Roles: []string{role}}, hclog.NewNullLogger())
		if err != nil {
			t.Fatalf("a %s certificate as issued is refused: %v", role, err)
		}
		return s
	}
	node, target, pusher := source("n2", RoleNode), source("vault", RoleBackup), source("n1", RoleNode)
	for _, tc := range []struct {
		name     string
		server   *Source
		dial     []grpc.DialOption
		refusals string // "": served
	}{
		{"a node dials a node", node, pusher.DialOptions(), ""},
		{"a node dials a target", target, pusher.BackupDialOptions(), ""},
		{"a target's certificate answers for a node", target, pusher.DialOptions(), ServerName},
		{"a node's certificate answers for a target", node, pusher.BackupDialOptions(), BackupServerName},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lis := bufconn.Listen(1 << 16)
			srv := grpc.NewServer(tc.server.ServerOptions()...)
			healthpb.RegisterHealthServer(srv, health.NewServer())
			go func() { _ = srv.Serve(lis) }()
			t.Cleanup(srv.Stop)
			conn, err := grpc.NewClient("passthrough:///agent", append(tc.dial,
				grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }))...)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_, err = healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
			switch {
			case tc.refusals == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.refusals != "" && (err == nil || !strings.Contains(err.Error(), tc.refusals)):
				t.Fatalf("got %v, want a refusal naming %s", err, tc.refusals)
			}
		})
	}
}

// TestTargetPolicy: a backup target serves nodes' pushes and nothing
// else; a node's agent port serves a backup target nothing.
func TestTargetPolicy(t *testing.T) {
	tests := []struct {
		policy Policy
		method string
		want   []string
	}{
		{TargetPolicy, "/zfsnomad.agent.v1.Replication/Receive", []string{RoleNode}},
		{TargetPolicy, "/zfsnomad.agent.v1.Replication/ReplicaState", []string{RoleNode}},
		{TargetPolicy, "/zfsnomad.agent.v1.NodeAgent/GetNode", nil},
		{TargetPolicy, "/zfsnomad.agent.v1.Peers/Ping", nil},
		{TargetPolicy, "/zfsnomad.agent.v1.NodeAgent/Replicate", nil},
		{TargetPolicy, "/zfsnomad.agent.v1.Backups/SendBackup", []string{RoleNode}},
		{TargetPolicy, "/zfsnomad.agent.v1.Backups/ListBackups", []string{RoleController, RoleOperator}},
		{TargetPolicy, "/zfsnomad.agent.v1.Backups/GrantRestore", []string{RoleController, RoleOperator}},
		{TargetPolicy, "/zfsnomad.agent.v1.Backups/DeleteBackups", []string{RoleOperator}},
		{TargetPolicy, "/zfsnomad.agent.v1.Backups/Other", nil},
	}
	for _, tt := range tests {
		if got := tt.policy.allowed(tt.method); !slices.Equal(got, tt.want) {
			t.Errorf("%s: allowed %v, want %v", tt.method, got, tt.want)
		}
	}
	for method := range AgentPolicy {
		if slices.Contains(AgentPolicy.allowed(method+"Any"), RoleBackup) {
			t.Errorf("the agent port lets a backup target call %s", method)
		}
	}
}
