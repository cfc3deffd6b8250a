// Package protocol versions the agent protocol: the gRPC services of
// proto/agentpb that zfs-controller and zfs-node builds call on one
// another's agent port (the controller on nodes; nodes on peers, for
// replication streams, lease pings and promises).
//
// Every call carries its caller's protocol version as gRPC metadata, and
// a node's agent port refuses a call whose version it does not accept,
// with FailedPrecondition naming both, before the handler runs. So builds
// that would misread one another never act on each other's calls: a node
// of another protocol looks unreachable to the controller (and its status
// says why), and to its peers, whose leases then fence it read-only
// rather than let it write beside a copy it cannot see
// (docs/install.md, "Driver versions").
//
// Raise Version when a change could be misread by a build of the current
// one: a field that carries a decision an older build would ignore, a
// call whose meaning changes, a removed call. Fields an older build may
// ignore safely (with a stated fallback, as ReplicateRequest's
// target_node_id) keep the version. A build accepts callers from
// MinVersion to Version; a build that raises Version must say in
// docs/install.md how a cluster crosses from the old one.
package protocol

import (
	"context"
	"fmt"
	"strconv"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// Version is the protocol this build speaks; MinVersion the oldest it
// accepts from callers.
const (
	Version    = 1
	MinVersion = 1
)

// Header is the metadata key that carries a call's protocol version.
const Header = "zfs-nomad-protocol"

// DialOptions make every call of a client carry this build's version.
func DialOptions() []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			return invoker(outgoing(ctx), method, req, reply, cc, opts...)
		}),
		grpc.WithChainStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
			return streamer(outgoing(ctx), desc, cc, method, opts...)
		}),
	}
}

func outgoing(ctx context.Context) context.Context {
	return metadata.AppendToOutgoingContext(ctx, Header, strconv.Itoa(Version))
}

// ServerOptions make a server refuse calls of a protocol this build does
// not accept; self names the server in the refusal ("node n2").
func ServerOptions(self string) []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
			if err := Check(ctx, self); err != nil {
				return nil, err
			}
			return handler(ctx, req)
		}),
		grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
			if err := Check(ss.Context(), self); err != nil {
				return err
			}
			return handler(srv, ss)
		}),
	}
}

// Check returns FailedPrecondition unless the call in ctx carries a
// version from MinVersion to Version. A call without one comes from a
// build older than protocol versions (version 0).
func Check(ctx context.Context, self string) error {
	v := 0
	md, _ := metadata.FromIncomingContext(ctx)
	if vals := md.Get(Header); len(vals) > 0 {
		n, err := strconv.Atoi(vals[0])
		if err != nil || n < 0 {
			return status.Errorf(codes.InvalidArgument, "%s: the call's %s metadata %q is not a protocol version", self, Header, vals[0])
		}
		v = n
	}
	if v >= MinVersion && v <= Version {
		return nil
	}
	return status.Error(codes.FailedPrecondition, refusal(self, v))
}

func refusal(self string, v int) string {
	caller := fmt.Sprintf("agent protocol %d", v)
	if v == 0 {
		caller = "no agent protocol version (a build older than protocol versions)"
	}
	accepts := fmt.Sprintf("protocol %d", Version)
	if MinVersion != Version {
		accepts = fmt.Sprintf("protocols %d to %d", MinVersion, Version)
	}
	return fmt.Sprintf("%s accepts agent %s, and this call came with %s: run zfs-controller and zfs-node builds of one protocol across the cluster (zfs-node --version and zfs-controller version print it; docs/install.md, \"Driver versions\")",
		self, accepts, caller)
}
