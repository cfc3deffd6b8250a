package agent

import (
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"
)

// Bulk data flows through gRPC streams of messages of 1 MiB (replication's
// chunks). gRPC's default flow-control windows (64 KiB, grown by BDP
// estimation) keep a fast stream waiting on window updates; large fixed
// windows let the sender keep several chunks in flight (see
// docs/replication.md for the measurements). A window is credit, not
// memory.
//
// Buffers are memory, held by every connection to or from the agent
// port for its life: a node of an N-node cluster keeps about 2N of them
// (its heartbeat's to each peer, each peer's to it), idle between beats.
// So they are 64 KiB each way, not the 1 MiB a stream might want: over
// TLS a read returns one record (at most 16 KiB) and writes are cut into
// records anyway, so a stream over TLS runs as fast (BenchmarkBulkStream;
// without TLS, a test network's setting, about 8 % slower), while 1 MiB
// of each makes a node of 30 hold about 80 MiB against 7 (and grows by
// about 2.5 MiB a peer: docs/architecture.md, "Scale"). A write buffer shared between
// connections (grpc.SharedWriteBuffer) does not help: every flush takes a
// whole buffer, so a beat's pings to every peer at once take as many.
const (
	streamWindow = 16 << 20
	connWindow   = 32 << 20
	bufferSize   = 64 << 10
)

// Keepalive pings notice a silent peer (a cut link, a frozen host) within
// about keepaliveTime+keepaliveTimeout on either end: the stream then fails,
// zfs receive sees its input end and keeps a resume token, and the next
// push resumes. Without them a TCP connection to a vanished peer hangs.
const (
	keepaliveTime    = 10 * time.Second
	keepaliveTimeout = 10 * time.Second
)

// MaxConnectionAge bounds how long a connection to the agent port takes
// new calls: then the server asks its client to reconnect (an HTTP/2
// GOAWAY) and new calls go over a new connection, made with the newest
// certificates of both ends, while the calls running on the old one
// finish there (no grace limit: a push is not cut). Every call checks
// the certificates of its connection, which are those of its handshake
// (tlsconfig.Source.ServerOptions), so a renewed certificate must be in
// use on every connection before the old one expires: it is within
// MaxConnectionAge (gRPC adds up to 10 % of jitter).
const MaxConnectionAge = time.Hour

// MaxConcurrentStreams bounds the calls one connection to the agent port
// carries at once (a peer's pusher or heartbeat, the controller): a peer,
// lying or not, cannot make the node run more handlers (and their reads
// of the pool) per connection than that. grpc-go clients wait for a free
// stream instead of failing. It is far above what a caller runs at once:
// a node receives at most replication.MaxReceives streams, the heartbeat
// makes one call per peer and beat, and the controller's long calls
// (pushes, catch-ups) are parallel_pushes (default 2) plus at most 4
// catch-ups per source; its short calls (a burst of publishes asking
// every node) at worst wait for one another.
const MaxConcurrentStreams = 256

// ServerOptions tune the agent port's gRPC server for bulk streams.
func ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.InitialWindowSize(streamWindow),
		grpc.InitialConnWindowSize(connWindow),
		grpc.ReadBufferSize(bufferSize),
		grpc.WriteBufferSize(bufferSize),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: keepaliveTime, Timeout: keepaliveTimeout, MaxConnectionAge: MaxConnectionAge}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: keepaliveTime / 2, PermitWithoutStream: true}),
		grpc.MaxConcurrentStreams(MaxConcurrentStreams),
	}
}

// DialOptions tune connections to peers for bulk streams.
func DialOptions() []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithInitialWindowSize(streamWindow),
		grpc.WithInitialConnWindowSize(connWindow),
		grpc.WithReadBufferSize(bufferSize),
		grpc.WithWriteBufferSize(bufferSize),
		// Also without streams: a pusher keeps its connections to peers
		// between pushes, and one to a vanished peer must fail rather
		// than hold the next push.
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: keepaliveTime, Timeout: keepaliveTimeout, PermitWithoutStream: true}),
	}
}
